"""The lagged LL snapshot's config view and refresh period (the workers themselves run in the e2e tests)."""

import pytest
from omegaconf import OmegaConf

from agent_system.trainer.config import compose_config
from agent_system.trainer.placement import assign_replica_ranks
from agent_system.trainer.snapshot import SNAPSHOT, snapshot_view


@pytest.mark.parametrize(("placement", "ll_gpus", "hl_gpus", "offset"), [("split", 1, 1, 2), ("split", 2, 3, 5)])
def test_snapshot_replicas_are_ranked_after_both_levels(placement, ll_gpus, hl_gpus, offset):
    # verl names servers and weight-transfer sockets by replica rank: the snapshot's must not collide with the levels'
    config = compose_config([f"mlmt.placement={placement}", f"mlmt.ll_gpus={ll_gpus}", f"mlmt.hl_gpus={hl_gpus}"])
    assign_replica_ranks(config)
    view = snapshot_view(config)
    assert view.actor_rollout_ref.rollout.custom.replica_rank_offset == offset
    assert view.actor_rollout_ref.rollout.custom.server_tag == SNAPSHOT
    assert view.actor_rollout_ref.model.path == config.actor_rollout_ref.model.path  # the LL's model
    assert config.actor_rollout_ref.rollout.custom.server_tag == "ll"  # the LL's own config is untouched


def test_snapshot_view_keeps_the_ll_sampling_settings():
    config = compose_config(["actor_rollout_ref.rollout.temperature=0.7"])
    assign_replica_ranks(config)
    view = snapshot_view(config)
    assert view.actor_rollout_ref.rollout.temperature == 0.7
    assert OmegaConf.select(view, "mlmt.reward.reg_gap") == config.mlmt.reward.reg_gap
