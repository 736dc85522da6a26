"""recipes/reinforce_kl on the trainer: REINFORCE with a KL penalty to a reference refreshed every 2 steps.

Real GSM8K rows from ../shared/data/gsm8k, preprocessed with the few-shot prompt (1 shot, to keep the tiny
model's prompts short), a tiny LL, ``rollout.name=hf``. The LL's KL to its reference (``ll/kl_mean``, measured on the
step's samples BEFORE that step's update) proves when the reference changes, with ``ref_refresh_freq=2``:

* step 1: reference = initial model = actor → KL 0;
* step 2: the actor was updated once, the reference was not → KL ≠ 0 (a sampled estimate: either sign); after
  the update the reference is refreshed (the actor's and the reference's log-probs on a fixed probe then agree:
  ``ll/ref_refresh_probe_gap`` 0);
* step 3: reference = actor after step 2 = the actor that samples step 3 → KL 0 again (without the refresh it would
  be > 0: the actor moved twice); the checkpoint at step 3 holds the actor after step 3 and the reference of step 2;
* resumed for step 4: the reference is loaded as saved (probe gap 0) — not the resumed actor (which would make the
  step-4 KL 0): KL ≠ 0; and step 4 refreshes again.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlmt_run import run_main

from agent_system.data.preprocess import preprocess

pytestmark = pytest.mark.e2e

# The data lives beside the repository (../shared/data); MLMT_SHARED_DATA overrides.
SHARED = Path(os.environ.get("MLMT_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))
GSM8K = SHARED / "gsm8k"
ZERO = 1e-5  # a sequence KL summed over a response: float noise of two identical fp32 models is far below this


@pytest.fixture
def gsm8k_few_shot(tmp_path):
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K} is not on this machine")
    files = {}
    for split in ("train", "test"):
        files[split] = tmp_path / f"gsm8k_{split}.parquet"
        preprocess(
            "gsm8k",
            str(files[split]),
            str(GSM8K / f"{split}.jsonl"),
            limit=8,
            few_shot=1,
            few_shot_pool=str(GSM8K / "train.jsonl"),
        )
    return [f"data.train_files={files['train']}", f"data.val_files={files['test']}"]


def test_reference_refresh_timing_and_resume(tiny_models, gsm8k_few_shot, tmp_path):
    out = tmp_path / "reinforce_kl"
    common = [
        *gsm8k_few_shot,
        f"actor_rollout_ref.model.path={tiny_models['ll']}",
        "actor_rollout_ref.rollout.name=hf",
        "mlmt.feedback=none",
        "mlmt.ll.adv_estimator=reinforce",
        "mlmt.stages.beta_turn1=[0.25]",
        "mlmt.ll.ref_refresh_freq=2",
        "mlmt.n=2",
        "data.train_batch_size=2",
        "data.max_prompt_length=1900",  # start-up also sizes the (unused) refine prompt
        "data.max_response_length=8",
        "actor_rollout_ref.actor.entropy_coeff=0.01",  # a gradient even when every reward is 0
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=3",
        "mlmt.reward.num_workers=1",
    ]
    first = run_main(out, [*common, "trainer.total_training_steps=3"])
    kl = {step: first[step]["ll/kl_mean"] for step in (1, 2, 3)}
    assert abs(kl[1]) < ZERO and abs(kl[2]) > 100 * ZERO and abs(kl[3]) < ZERO, kl  # a sampled KL: either sign
    assert [("ll/ref_refreshed" in first[s]) for s in (1, 2, 3)] == [False, True, False]
    # kl_in=loss: β1·kl in the actor's loss, 0 where the reference is the actor (the start, just after a refresh)
    loss = {step: first[step]["ll/turn_kl_loss"] for step in (1, 2, 3)}
    assert abs(loss[1]) < ZERO and loss[2] > 100 * ZERO and abs(loss[3]) < ZERO, loss
    assert first[2]["ll/ref_refresh_probe_gap"] < ZERO
    assert (out / "checkpoints/global_step_3/ll_reference/rank_0.pt").is_file()

    resumed = run_main(out, [*common, "trainer.total_training_steps=4"])
    assert 4 in resumed and 2 not in resumed, resumed.keys()  # continued after step 3
    assert resumed[3]["resume/ll_reference_logprob_max_abs_diff"] == 0.0, resumed[3]
    assert abs(resumed[4]["ll/kl_mean"]) > 100 * ZERO, resumed[4]
    assert resumed[4]["ll/ref_refresh_probe_gap"] < ZERO
