"""agent_system/methods/reinforce_kl/ref_refresh.py without Ray: the shard copy and save/load on real torch modules, the
refresh timing and the config validation of ``mlmt.ll.ref_refresh_freq``. The worker calls themselves run in
tests/e2e/test_reinforce_kl_on_cpu.py (real verl workers)."""

from __future__ import annotations

import pytest
import torch

from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.methods.reinforce_kl.ref_refresh import (
    ReferenceRefresh,
    copy_parameters,
    load_shard_state,
    shard_state,
)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def test_copy_makes_the_reference_compute_what_the_actor_computes():
    actor, reference, probe = _model(0), _model(1), torch.randn(5, 4)
    assert not torch.equal(actor(probe), reference(probe))
    assert copy_parameters(actor, reference) == 4
    assert torch.equal(actor(probe), reference(probe))
    with torch.no_grad():
        actor[0].weight.add_(1.0)  # the copy is a copy, not an alias
    assert not torch.equal(actor(probe), reference(probe))


def test_copy_rejects_a_different_sharding_naming_the_parameter():
    actor = _model(0)
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with pytest.raises(ValueError, match="parameter 2.weight"):
        copy_parameters(actor, other)


def test_shard_state_round_trip(tmp_path):
    reference, probe = _model(0), torch.randn(5, 4)
    expected = reference(probe)
    path = tmp_path / "rank_0.pt"
    torch.save(shard_state(reference), path)
    restored = _model(2)
    load_shard_state(restored, torch.load(path, weights_only=True), str(path))
    assert torch.equal(restored(probe), expected)
    with pytest.raises(ValueError, match="rank_0.pt"):
        load_shard_state(torch.nn.Linear(4, 8), torch.load(path, weights_only=True), str(path))


def test_due_after_every_nth_step():
    class Tokenizer:
        pad_token_id, eos_token_id = 0, 0

        def __len__(self):
            return 100

    assert [s for s in range(1, 9) if ReferenceRefresh(2, Tokenizer()).due(s)] == [2, 4, 6, 8]
    assert [s for s in range(1, 9) if ReferenceRefresh(3, Tokenizer()).due(s)] == [3, 6]
    never = ReferenceRefresh(0, Tokenizer())
    assert not never.enabled and not any(never.due(s) for s in range(1, 9))


SINGLE_TURN = ["mlmt.feedback=none", "mlmt.ll.adv_estimator=reinforce", "mlmt.n=1"]


def test_config_needs_a_reference_model():
    with pytest.raises(ConfigError, match="mlmt.ll.ref_refresh_freq=2 .*mlmt.stages.beta_turn1.*use_kl_loss"):
        check_config(compose_config([*SINGLE_TURN, "mlmt.ll.ref_refresh_freq=2"]))
    with pytest.raises(ConfigError, match="mlmt.ll.ref_refresh_freq=-1"):
        check_config(compose_config([*SINGLE_TURN, "mlmt.ll.ref_refresh_freq=-1", "mlmt.stages.beta_turn1=[0.25]"]))
    check_config(compose_config([*SINGLE_TURN, "mlmt.ll.ref_refresh_freq=2", "mlmt.stages.beta_turn1=[0.25]"]))
    check_config(
        compose_config([*SINGLE_TURN, "mlmt.ll.ref_refresh_freq=2", "actor_rollout_ref.actor.use_kl_loss=true"])
    )
    assert compose_config([]).mlmt.ll.ref_refresh_freq == 0  # the default: never
