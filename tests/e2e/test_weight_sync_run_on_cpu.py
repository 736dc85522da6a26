"""Weight syncs per step in a real run with sleep mode on (issue 17, item 8; issue 33, item 4): ``python -m
verl.trainer.main_mlmt``,
the project's ``hf`` rollout server with ``rollout.free_cache_engine=true`` (it frees the weights on sleep as vLLM's
sleep mode does on a GPU, and refuses to generate while asleep; vLLM-CPU has no sleep mode), split placement, the
HL frozen, two validation batches per validation (``data.val_batch_size=1``, 2 rows), a validation every step.

Counted syncs (``perf/weight_syncs/<level>``, actor -> rollout servers; docs/ARCHITECTURE.md, "Weight syncs", row
"split, HL frozen"):

* the LL: 1 at the validation before training (the servers start without the weights), then 1 per step: the
  validation loads the update's weights, once for both of its batches, and the servers stay awake into the next
  step's rollout (before issue 33: 2 per step, the training rollout reloading what the validation's sleep freed);
* the frozen HL under split placement: its servers never sleep, so 1 at the start and 0 after.

Each push is timed (``timing_s/sync_<level>``): > 0 at a step with a push, 0 at a step without one.
"""

from __future__ import annotations

import pytest
from mlmt_run import run_main

pytestmark = pytest.mark.e2e


def test_syncs_per_step_with_sleep_mode(tiny_models, cue_data, tmp_path):
    steps = run_main(
        tmp_path / "run",
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"hl.model.path={tiny_models['hl']}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            "actor_rollout_ref.rollout.name=hf",
            "hl.rollout.name=hf",
            "actor_rollout_ref.rollout.free_cache_engine=true",
            "hl.rollout.free_cache_engine=true",
            "mlmt.placement=split",
            "mlmt.hl.freeze=true",
            "data.train_batch_size=2",
            "data.val_batch_size=1",
            "data.max_response_length=6",
            "hl.rollout.response_length=4",
            "mlmt.n=2",
            "mlmt.m=2",
            "mlmt.reward.num_workers=1",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=true",
            "trainer.test_freq=1",
            "trainer.save_freq=-1",
        ],
    )
    syncs = {step: (values["perf/weight_syncs/ll"], values["perf/weight_syncs/hl"]) for step, values in steps.items()}
    assert syncs == {0: (1.0, 1.0), 1: (1.0, 0.0), 2: (1.0, 0.0)}, syncs
    for step in (1, 2):
        assert steps[step]["timing_s/sync_ll"] > 0 and steps[step]["timing_s/sync_hl"] == 0, steps[step]
    assert all("val/acc@t1" in steps[step] for step in (0, 1, 2)), steps
