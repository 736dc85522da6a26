"""The lagged LL snapshot of the contrastive HL reward, end to end (``python -m verl.trainer.main_mlmt``, cue task).

One run of 5 steps with ``reg_gap=2`` (refreshes after the LL updates of steps 2 and 4) and ``save_freq=3``
(checkpoints at 3 and 5), then a crash between the refresh of step 4 and the checkpoint of step 5 (the step-5
checkpoint is removed and ``latest`` points at 3, as a crash during step 5 leaves them; the refresh folder holds the
LL of step 4), and an ``auto`` resume of the same run folder.

* The lag: at every step the snapshot that generates R_ref holds the LL's weights of its last refresh (probe
  log-probs equal to the LL's at that refresh), not the current LL's (a probe gap to the LL once the LL has been
  updated since), and refreshes happen at steps 2 and 4 only.
* The resume: both levels (fine-tuned in full) resume exactly (the probe's log-probs equal the saved ones); the
  resumed snapshot is the checkpoint's (the LL of step 2), not the newer refresh folder's; it scores
  the probe exactly as the uninterrupted run's snapshot did at step 4.

Measured: 155 s on the 2-core machine (both runs). Deliberate breaks, each run once: the resume loading the newest
refresh folder (the code before this test) fails with ``resume/ll_snapshot_logprob_max_abs_diff`` 0.755; a
snapshot refreshed at every step (R_ref from the current solver) fails on the refresh steps [0, 1, 2, 3, 4].
"""

from __future__ import annotations

import pytest
from mlmt_run import run_main

from agent_system.trainer import state as st

pytestmark = pytest.mark.e2e


def _overrides(ll, hl, data):
    return [
        f"actor_rollout_ref.model.path={ll}",
        f"hl.model.path={hl}",
        f"data.train_files={data[0]}",
        f"data.val_files={data[1]}",
        "data.max_response_length=6",
        "hl.rollout.response_length=4",
        "mlmt.reward.num_workers=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "actor_rollout_ref.rollout.name=hf",
        "hl.rollout.name=hf",
        "data.train_batch_size=2",
        "mlmt.n=2",
        "mlmt.m=2",
        "trainer.total_training_steps=5",
        "trainer.save_freq=3",
        "mlmt.reward.hl_reward=contrastive",
        "mlmt.reward.contrastive_reference=lagged_snapshot",
        "mlmt.reward.reg_gap=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",  # the LL moves visibly at every update
    ]


@pytest.mark.extended
@pytest.mark.slow(seconds=220)
def test_the_snapshot_lags_and_a_resume_restores_the_checkpoints_one(cue_ll_unsure, cue_hl, cue_data, tmp_path):
    out = tmp_path / "run"
    overrides = _overrides(cue_ll_unsure, cue_hl, cue_data)
    first = run_main(out, overrides)
    assert sorted(first) == [1, 2, 3, 4, 5]
    # the snapshot generating R_ref at step s holds the LL of the last refresh before s ...
    assert [first[s]["ll_snapshot/weights_step"] for s in range(1, 6)] == [0, 0, 2, 2, 4]
    assert [s for s in first if "ll_snapshot/refreshed" in first[s]] == [2, 4]
    for s in first:
        assert first[s]["ll_snapshot/probe_gap_to_refresh"] == 0.0, (s, first[s])
    for s in (2, 4):
        assert first[s]["ll_snapshot/refresh_probe_gap"] == 0.0  # loaded exactly the LL's weights
    # ... which the current LL has moved away from once updated since the refresh (it was updated at s − 1)
    gaps = [first[s]["ll_snapshot/probe_gap_to_ll"] for s in range(1, 6)]
    assert gaps[0] == gaps[2] == gaps[4] == 0.0 and min(gaps[1], gaps[3]) > 1e-4, gaps
    assert [p.name for p in (out / "reg_ref_checkpoint").iterdir()] == ["step_4"]

    # a crash during step 5, after the refresh of step 4: the last complete checkpoint is step 3's
    checkpoints = out / "checkpoints"
    saved = st.read_trainer_state(checkpoints, 3)
    assert saved["snapshot"]["refreshed_at"] == 2
    assert (st.step_dir(checkpoints, 3) / "ll_snapshot").is_dir()
    for path in sorted(st.step_dir(checkpoints, 5).rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    st.step_dir(checkpoints, 5).rmdir()
    st.mark_latest(checkpoints, 3)

    resumed = run_main(out, [*overrides, "trainer.resume_mode=auto"])
    assert sorted(s for s in resumed if "ll/pg_loss" in resumed[s]) == [4, 5]
    # both levels fine-tuned in full: the resumed actors score the probe exactly as the saved ones did
    assert resumed[3]["resume/ll_logprob_max_abs_diff"] == resumed[3]["resume/hl_logprob_max_abs_diff"] == 0.0
    assert resumed[3]["resume/ll_snapshot_logprob_max_abs_diff"] == 0.0
    assert resumed[4]["ll_snapshot/weights_step"] == 2
    assert resumed[4]["ll_snapshot/probe_gap_to_refresh"] == 0.0
    # the resumed snapshot scores the probe exactly as the uninterrupted run's did at step 4 (and not as the LL of
    # step 4, which the crashed run's refresh folder held)
    assert resumed[4]["ll_snapshot/probe_logprob_sum"] == first[4]["ll_snapshot/probe_logprob_sum"]
    assert first[4]["ll_snapshot/probe_logprob_sum"] != first[5]["ll_snapshot/probe_logprob_sum"]
