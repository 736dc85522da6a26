"""Each trained level's estimator is called once before any worker starts, as the trainer calls it, on a synthetic
batch of the run's nested groups (``advantages.estimator_contract_error``, ``main.check_estimators``): a plug-in's shape
bug is one line naming the estimator at start-up, where it used to show only after the first rollouts (issue 42,
point 11)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig

from agent_system import methods
from agent_system.config import ConfigError
from agent_system.launcher.main import check_estimators
from agent_system.trainer import advantages as adv


def _mlmt(ll="grpo", hl="grpo", n=3, m=2, group_by="problem"):
    return OmegaConf.create(
        {"n": n, "m": m, "ll": {"adv_estimator": ll, "turn3_group_by": group_by}, "hl": {"adv_estimator": hl}}
    )


def _rows_only(token_level_rewards, response_mask, index, config=None, **kwargs):
    scores = token_level_rewards.sum(-1)
    return scores, scores  # (rows,) where (rows, tokens) is expected


def _groups_of_four(token_level_rewards, response_mask, index, config=None, **kwargs):
    scores = token_level_rewards.sum(-1).view(-1, 4)  # assumes groups of four rows, as a plug-in tried on one shape
    advantages = (scores - scores.mean(-1, keepdim=True)).view(-1, 1) * response_mask
    return advantages, advantages


def _divides_by_spread(token_level_rewards, response_mask, index, config=None, **kwargs):
    scores = token_level_rewards.sum(-1, keepdim=True)
    advantages = (scores - scores.mean()) / (scores.std() * 0) * response_mask  # no epsilon
    return advantages, advantages


@pytest.fixture
def register():
    """``register(name, fn)``: ``fn`` registered as a critic-free estimator for this test only (an estimator left in
    the registry is one every other test that walks the accepted names would call)."""
    names = []

    def add(name, fn):
        adv.register_estimator(name)(fn)
        names.append(name)

    yield add
    for name in names:
        adv.CRITIC_FREE.remove(name)


@pytest.fixture
def broken(register):
    for name, fn in (
        ("test_rows_only", _rows_only),
        ("test_groups_of_four", _groups_of_four),
        ("test_divides_by_spread", _divides_by_spread),
    ):
        register(name, fn)


def test_the_built_in_and_method_estimators_keep_the_contract():
    methods.import_all()
    names = [*adv.VERL_ESTIMATORS, *adv.CRITIC_FREE, *adv.VALUE_ESTIMATORS]
    names = [name for name in names if not name.startswith("test_")]
    assert {"grpo", "reinforce", "gae"} <= set(names)
    for name in names:
        for level in ("ll", "hl"):
            assert adv.estimator_contract_error(level, _mlmt(ll=name, hl=name), AlgoConfig()) is None, (name, level)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("test_rows_only", "returned shapes [(6,), (6,)] for the 6 turn-1 rows"),
        ("test_groups_of_four", "raised RuntimeError on the turn-1 rows"),
        ("test_divides_by_spread", "returned a non-finite advantage or return on a turn-1 response token"),
    ],
)
def test_a_broken_estimator_is_named_with_what_it_did(broken, name, expected):
    error = adv.estimator_contract_error("ll", _mlmt(ll=name), AlgoConfig())
    assert error.startswith(f"mlmt.ll.adv_estimator={name} on a synthetic batch of 18 rows"), error
    assert expected in error, error
    with pytest.raises(ConfigError, match=f"mlmt.ll.adv_estimator={name}"):
        check_estimators(OmegaConf.create({"mlmt": _mlmt(ll=name), "algorithm": {}}), ["ll"])


def test_only_the_trained_levels_are_called(broken):
    config = OmegaConf.create({"mlmt": _mlmt(hl="test_rows_only"), "algorithm": {}})
    check_estimators(config, ["ll"])  # a frozen HL's estimator never runs
    with pytest.raises(ConfigError, match="mlmt.hl.adv_estimator=test_rows_only .* turn-2 rows"):
        check_estimators(config, ["ll", "hl"])


SEEN: dict[str, list] = {}


def _records(token_level_rewards, response_mask, index, config=None, **kwargs):
    SEEN.setdefault("index", []).append(list(index))
    zeros = torch.zeros_like(token_level_rewards)
    return zeros, zeros


def test_the_synthetic_batch_has_the_runs_nested_groups(register):
    register("test_records_its_groups", _records)
    seen = SEEN
    seen.clear()

    assert adv.estimator_contract_error("hl", _mlmt(hl="test_records_its_groups", n=2, m=3), AlgoConfig()) is None
    (hl_index,) = seen.pop("index")
    assert len(hl_index) == 2 * 2 * 3 and len(set(hl_index)) == 2 * 2  # the m feedbacks on one attempt
    adv.estimator_contract_error("ll", _mlmt(ll="test_records_its_groups", n=2, m=3), AlgoConfig())
    turn1, turn3 = seen["index"]  # once per turn
    assert len(turn1) == 4 and len(set(turn1)) == 2 and len(turn3) == 12 and len(set(turn3)) == 2
    assert np.all([key.endswith("/t1") for key in turn1])


def test_the_minimal_estimator_of_extending_md_keeps_the_contract():
    text = (Path(__file__).resolve().parents[3] / "docs" / "EXTENDING.md").read_text()
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "group_mean" in block]
    names = list(adv.CRITIC_FREE)
    exec(textwrap.dedent(example), {})
    adv.CRITIC_FREE[:] = names  # registered for this test only
    assert adv.estimator_contract_error("ll", _mlmt(ll="group_mean"), AlgoConfig()) is None
    assert adv.estimator_contract_error("hl", _mlmt(hl="group_mean"), AlgoConfig()) is None
