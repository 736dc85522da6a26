"""Each optimizer's lr schedule spans the updates its level actually gets (issue 16, item 1).

verl steps a level's scheduler once per update call; a level updated on only some steps ((tH, tL) schedule) or on
every step because the other is frozen must get a horizon of that many updates. The lr is read from verl's own
scheduler, built as its FSDP engine builds it (``verl_compat.build_lr_scheduler``), stepped once per update of the
level as the trainer's schedule (``levels_to_update``) gives them.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from agent_system import verl_compat as vc
from agent_system.config import compose_config
from agent_system.launcher.main import set_schedule_horizon
from agent_system.trainer.advantages import critic_levels
from agent_system.trainer.schedule import levels_to_update

COSINE = [
    f"{tree}.optim.{key}"
    for tree in ("actor_rollout_ref.actor", "hl.actor", "critic", "hl_critic")
    for key in ("lr_scheduler_type=cosine", "lr_warmup_steps_ratio=0.1")
]


def _updates(config, total: int) -> dict[str, int]:
    frozen = {"ll": bool(config.mlmt.ll.freeze), "hl": bool(config.mlmt.hl.freeze)}
    counts = {"ll": 0, "hl": 0}
    for step in range(1, total + 1):
        for level in levels_to_update(step, config.mlmt.schedule, frozen):
            counts[level] += 1
    return counts


def _lrs(config, section: str, updates: int) -> tuple[list[float], float]:
    """Relative lr of each of ``updates`` updates under verl's scheduler, and its value after the last one."""
    optim = vc.omega_conf_to_dataclass(OmegaConf.select(config, section))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    scheduler = vc.build_lr_scheduler(optim, optimizer)
    lrs = []
    for _ in range(updates):
        lrs.append(scheduler.get_last_lr()[0] / optim.lr)
        optimizer.step()
        scheduler.step()
    return lrs, scheduler.get_last_lr()[0] / optim.lr


def test_rr_1_15_each_level_reaches_its_peak_and_ends_its_cosine():
    # the numbers: 500 steps of (1, 15), cosine, warm-up 0.1. Before: both optimizers got 500; the HL's 31
    # updates peaked at 0.60 of its lr and never decayed, the LL's cosine stopped at 469/500.
    config = compose_config(["trainer.total_training_steps=500", "mlmt.schedule.tH=1", "mlmt.schedule.tL=15", *COSINE])
    set_schedule_horizon(config, train_rows=10_000)
    updates = _updates(config, 500)
    assert updates == {"ll": 469, "hl": 31}
    for section, level in (("actor_rollout_ref.actor.optim", "ll"), ("hl.actor.optim", "hl")):
        lrs, after = _lrs(config, section, updates[level])
        assert max(lrs) == pytest.approx(1.0), section  # the warm-up ends inside the level's updates
        assert lrs[-1] < 0.01, section  # the decay reaches the end ...
        assert after == pytest.approx(0.0, abs=1e-12), section  # ... exactly at the last update
        assert lrs.index(max(lrs)) == int(0.1 * updates[level]), section  # warm-up = 10% of the level's updates


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["mlmt.hl.freeze=true"], {"ll": 40, "hl": 0}),  # the LL trains every step
        (["mlmt.ll.freeze=true"], {"ll": 0, "hl": 40}),
        (["mlmt.schedule.tH=5", "mlmt.schedule.tL=20"], {"ll": 35, "hl": 5}),  # HL at steps 20-24
        (["mlmt.schedule.tH=1", "mlmt.schedule.tL=1"], {"ll": 40, "hl": 40}),
    ],
)
def test_horizon_is_the_levels_update_count_and_critics_follow_their_level(overrides, expected):
    config = compose_config(["trainer.total_training_steps=40", "mlmt.ll.adv_estimator=gae",
                             "mlmt.hl.adv_estimator=gae", *COSINE, *overrides])  # fmt: skip
    assert set_schedule_horizon(config, train_rows=1000) == expected == _updates(config, 40)
    for level, sections in (("ll", ("actor_rollout_ref.actor.optim", "critic.optim")),
                            ("hl", ("hl.actor.optim", "hl_critic.optim"))):  # fmt: skip
        if not expected[level]:  # a level without updates gets no critic (config.critic_levels): only its actor's
            assert level not in critic_levels(config)
            sections = sections[:1]
        for section in sections:
            assert OmegaConf.select(config, section).total_training_steps == max(expected[level], 1), section
            if expected[level]:
                lrs, after = _lrs(config, section, expected[level])
                assert max(lrs) == pytest.approx(1.0) and after == pytest.approx(0.0, abs=1e-12), section


def test_epochs_mode_counts_the_data_and_a_users_horizon_is_kept():
    epochs = ["trainer.total_training_steps=null", "trainer.total_epochs=2", "data.train_batch_size=8"]
    config = compose_config(
        [*epochs, "mlmt.schedule.tH=1", "mlmt.schedule.tL=3", "critic.optim.total_training_steps=7"]
    )
    assert set_schedule_horizon(config, train_rows=20) == {"ll": 3, "hl": 1}  # 2 × ⌊20 / 8⌋ = 4 steps
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 3
    assert config.hl.actor.optim.total_training_steps == 1
    assert config.critic.optim.total_training_steps == 7  # set by the user
