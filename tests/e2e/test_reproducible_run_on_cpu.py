"""A run on the ``hf`` server under ``rollout.full_determinism`` is reproducible, however its requests were batched.

The server batches requests as they happen to arrive; each request's sample comes from its own seed (the level's
``rollout.seed`` and the request's id, policy.request_seed), so the same run with every request served alone
(``engine_kwargs.hf.max_batch_size=1``) writes the same episodes at every step, the second step's sampled from weights
the first step's update produced. Before requests had seeds, the samples varied from run to run, and a learning test
(test_learning_levels_on_cpu.py) failed once on unchanged code.
"""

from __future__ import annotations

import pytest
from mlmt_run import HF_TOY_RUN, run_main, trajectories

pytestmark = pytest.mark.e2e

TEXTS = ("attempt", "feedback", "refinement")


def _run(out, cue_ll_unsure, cue_hl, cue_data, extra: list[str]) -> dict:
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={cue_ll_unsure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            "trainer.total_training_steps=2",
            "data.train_batch_size=2",
            "data.max_response_length=6",
            "hl.rollout.response_length=4",
            "mlmt.n=2",
            "mlmt.m=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "hl.actor.optim.lr=1e-2",
            *HF_TOY_RUN,
            *extra,
        ],
    )
    return {s: [{k: r[k] for k in TEXTS} for r in trajectories(out, s)] for s in metrics}


def test_the_same_run_batched_or_one_request_at_a_time_writes_the_same_episodes(
    cue_ll_unsure, cue_hl, cue_data, tmp_path
):
    batched = _run(tmp_path / "batched", cue_ll_unsure, cue_hl, cue_data, [])
    alone = [f"{tree}.rollout.engine_kwargs.hf.max_batch_size=1" for tree in ("actor_rollout_ref", "hl")]
    one_at_a_time = _run(tmp_path / "alone", cue_ll_unsure, cue_hl, cue_data, alone)
    assert sorted(batched) == [1, 2] and len(batched[1]) == 2 * 2 * 4
    assert one_at_a_time == batched
    # and the seed acts: another rollout seed samples other episodes
    seed_7 = ["actor_rollout_ref.rollout.seed=7", "hl.rollout.seed=7"]
    reseeded = _run(tmp_path / "reseeded", cue_ll_unsure, cue_hl, cue_data, seed_7)
    assert [r["feedback"] for r in reseeded[1]] != [r["feedback"] for r in batched[1]]
