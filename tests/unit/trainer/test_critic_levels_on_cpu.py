"""Which levels get a value model (``config.critic_levels``, what ``main.build_trainer`` builds and the trainer
saves with every checkpoint): a level whose estimator reads one, unless it is frozen (issue 16, item 9: a frozen
level's critic was built, held in memory and written to every checkpoint although it never acted).
"""

import copy

import pytest
from omegaconf import OmegaConf

from agent_system.trainer.config import compose_config, critic_levels

BASE = compose_config([])  # composed once: the cases below change only mlmt keys


def _levels(*overrides: str) -> tuple[str, ...]:
    config = copy.deepcopy(BASE)
    for override in overrides:
        key, value = override.split("=")
        OmegaConf.update(config, key, OmegaConf.create(f"v: {value}").v)  # YAML-typed, as Hydra reads it
    return critic_levels(config)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), ()),  # grpo at both levels: no critic
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae"), ("ll", "hl")),
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae", "mlmt.hl.freeze=true"), ("ll",)),
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae", "mlmt.ll.freeze=true"), ("hl",)),
        (("mlmt.hl.adv_estimator=gae", "mlmt.hl.freeze=true"), ()),
        (("mlmt.ll.adv_estimator=value_baseline",), ("ll",)),
        # no HL without a feedback writer: its estimator has no critic to build
        (("mlmt.ll.adv_estimator=gae", "mlmt.hl.adv_estimator=gae", "mlmt.feedback=self"), ("ll",)),
    ],
)
def test_a_critic_for_each_training_level_whose_estimator_reads_one(overrides, expected):
    assert _levels(*overrides) == expected
