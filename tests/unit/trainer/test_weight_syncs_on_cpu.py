"""One weight push per weight change (issue 33, item 4): pushes per step for each placement and (tH, tL) schedule,
against the table of docs/ARCHITECTURE.md ("Weight syncs").

The unit tier cannot start Ray, so each group here is a real :class:`PolicyGroup` whose ``CheckpointEngineManager``
is replaced by servers that record the calls the group makes (``update_weights``: a push of the actor's current
version, which wakes them; a sleep through ``verl_compat.sleep_replicas``: in sleep mode it frees the weights, as
vLLM's level-2 sleep does, or keeps them asleep at level 1; ``wake_up_replicas``: the wake-up of servers that kept
them). Every generation checks that the servers are awake and hold the actor's current weights, so a skipped push or
wake-up fails. The steps call :class:`RolloutWeights` in the order ``MLMTTrainer.fit`` does. Before issue 33 a level
was pushed at every wake-up that followed a sleep: 2 pushes per level per step with a validation every step, whatever
the schedule; the same counts on real workers: ``tests/e2e/test_weight_sync_run_on_cpu.py``. Before issue 43 (item 7)
every sleep discarded the weights, so under ``colocated`` a level the step did not update was pushed again.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agent_system import verl_compat
from agent_system.levels.policy import PolicyGroup
from agent_system.levels.weight_sync import RolloutWeights, keeps_weights_asleep, pushes_per_step, sleeps_for_training
from agent_system.trainer.schedule import levels_to_update, update_steps

DOCS = Path(__file__).resolve().parents[3] / "docs" / "ARCHITECTURE.md"
SNAPSHOT = "ll_snapshot"


class _Servers:
    """A level's rollout servers: which actor version they hold (None: no weights), and the calls they got."""

    def __init__(self, group: PolicyGroup, sleep_mode: bool, push_s: float = 0.0) -> None:
        self.group, self.sleep_mode, self.push_s = group, sleep_mode, push_s
        self.calls, self.version, self.awake = [], None, True  # vLLM starts from dummy weights
        self.replicas = []  # the servers each wake-up checks are alive (none here: no Ray)

    def update_weights(self, global_steps):
        time.sleep(self.push_s)
        self.calls.append(("push", global_steps))
        self.version, self.awake = self.group.actor_version, True

    def sleep(self, keep_weights):
        """``verl_compat.sleep_replicas`` on these servers: level 1 with ``keep_weights``, else verl's level 2."""
        self.calls.append(("sleep", 1 if keep_weights else 2))
        if self.sleep_mode:
            self.awake = False
            if not keep_weights:
                self.version = None

    def wake_up_replicas(self):
        self.calls.append(("wake", None))
        assert self.version is not None, f"{self.group.level}: woken after a sleep that discarded the weights"
        self.awake = True


@pytest.fixture(autouse=True)
def _servers_sleep(monkeypatch):
    monkeypatch.setattr(verl_compat, "sleep_replicas", lambda manager, keep_weights: manager.sleep(keep_weights))


def _group(level, sleep_mode=True, push_s=0.0):
    view = OmegaConf.create({"actor_rollout_ref": {"rollout": {"free_cache_engine": sleep_mode}}})
    group = PolicyGroup(level, view, worker_group=None, use_ref=False)
    group.actor_version = 0
    group.checkpoint_manager = _Servers(group, sleep_mode, push_s)
    return group


def _changed(group):
    group.actor_version += 1  # an update, a checkpoint load, a snapshot refresh
    group.weights_changed()


def _generate(groups):
    for group in groups.values():
        servers = group.checkpoint_manager
        assert servers.awake, f"{group.level}: generating on sleeping servers"
        assert servers.version is not None, f"{group.level}: generating without weights"
        assert servers.version == group.actor_version, f"{group.level}: generating with stale weights"


def _run(placement, schedule, steps, freeze_hl=False, validate=True, sleep_mode=True, reg_gap=None, groups=None):
    """Pushes per step of a run whose steps call the weight-sync logic as ``MLMTTrainer.fit`` does; ``groups``: a
    dict filled with the run's groups."""
    groups = {} if groups is None else groups
    groups.update({level: _group(level, sleep_mode) for level in ("ll", "hl")})
    if reg_gap:
        groups[SNAPSHOT] = _group(SNAPSHOT, sleep_mode)
    weights = RolloutWeights(groups, placement, reads_other_levels=False)
    frozen = {"ll": False, "hl": freeze_hl}
    schedule = OmegaConf.create({"tH": schedule[0], "tL": schedule[1]})
    pushes = {}

    def validation():
        weights.wake(step)
        _generate(groups)

    step = 0
    if validate:
        validation()
        pushes[0] = weights.take()
    for step in range(1, steps + 1):
        weights.wake(step)
        _generate(groups)
        active = levels_to_update(step, schedule, frozen)
        weights.sleep_for_training(active)
        for level in active:
            _changed(groups[level])
        if reg_gap and step % reg_gap == 0:
            _changed(groups[SNAPSHOT])
        if validate:
            validation()
        pushes[step] = weights.take()
    return {step: {k: v for k, v in m.items() if k.startswith("perf/")} for step, m in pushes.items()}


def _documented_table() -> dict[str, dict[str, tuple[float, float] | None]]:
    """docs/ARCHITECTURE.md's pushes per step: run → column → (LL, HL), None for a dash."""
    section = DOCS.read_text(encoding="utf-8").split("## Weight syncs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Run")]
    columns = ("step 0", "both", "ll", "hl")
    table = {}
    for line in rows:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table[cells[0]] = {
            column: None if cell == "–" else tuple(float(x) for x in cell.split(","))
            for column, cell in zip(columns, cells[1:], strict=True)
        }
    return table


def _category(step, run):
    placement, schedule = run.split(", ", 1)
    if step == 0:
        return "step 0"
    frozen = {"ll": False, "hl": schedule == "HL frozen"}
    t_high, t_low = (1, 1) if schedule == "HL frozen" else map(int, re.findall(r"\d+", schedule))
    active = levels_to_update(step, OmegaConf.create({"tH": t_high, "tL": t_low}), frozen)
    return "both" if len(active) == 2 else active[0]


def test_the_documented_table_covers_both_placements_and_schedules():
    assert set(_documented_table()) == {
        f"{placement}, {schedule}"
        for placement in ("split", "colocated")
        for schedule in ("(1, 1)", "(1, 15)", "HL frozen")
    }


@pytest.mark.parametrize("run", sorted(_documented_table()))
def test_pushes_per_step_match_the_documented_table(run):
    placement, schedule = run.split(", ", 1)
    ratio = (1, 15) if schedule == "(1, 15)" else (1, 1)
    steps = 16 if ratio == (1, 15) else 4  # (1, 15): the HL updates at step 15
    counted = _run(placement, ratio, steps, freeze_hl=schedule == "HL frozen")
    expected = _documented_table()[run]
    for step, pushes in counted.items():
        ll_hl = expected[_category(step, run)]
        assert ll_hl is not None, f"{run}: step {step} is of a kind the table marks absent"
        assert (pushes["perf/weight_syncs/ll"], pushes["perf/weight_syncs/hl"]) == ll_hl, (run, step, counted)


@pytest.mark.parametrize("sleep_mode", [True, False])
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("run", sorted(_documented_table()))
def test_pushes_per_step_states_what_the_groups_do(run, validate, sleep_mode):
    """The pure statement of the rules (what scripts/gpu_check.py expects) against the groups' own pushes."""
    placement, schedule = run.split(", ", 1)
    ratio = (1, 15) if schedule == "(1, 15)" else (1, 1)
    steps = 16 if ratio == (1, 15) else 4
    counted = _run(placement, ratio, steps, freeze_hl=schedule == "HL frozen", validate=validate, sleep_mode=sleep_mode)
    frozen = {"ll": False, "hl": schedule == "HL frozen"}
    updates = update_steps(steps, OmegaConf.create({"tH": ratio[0], "tL": ratio[1]}), frozen)
    stated = pushes_per_step(sorted(counted), updates, sorted(counted) if validate else [])
    assert {step: {f"perf/weight_syncs/{k}": float(v) for k, v in c.items()} for step, c in stated.items()} == counted


def test_one_push_per_update_over_a_run_under_split():
    counted = _run("split", (1, 15), 32)
    updates = {"ll": 30, "hl": 2}  # HL steps 15 and 31
    for level in ("ll", "hl"):
        assert sum(p[f"perf/weight_syncs/{level}"] for p in counted.values()) == 1 + updates[level]


def test_without_validation_the_push_of_an_update_moves_to_the_next_rollout():
    counted = _run("split", (1, 15), 16, validate=False)
    ll = [counted[step]["perf/weight_syncs/ll"] for step in range(1, 17)]
    hl = [counted[step]["perf/weight_syncs/hl"] for step in range(1, 17)]
    assert ll == [1.0] * 14 + [1.0, 0.0]  # step 1: the initial weights; 2..15: the previous step's update
    assert hl == [1.0] + [0.0] * 14 + [1.0]  # step 1: the initial weights; 16: step 15's update


@pytest.mark.parametrize("sleep_mode", [True, False])
def test_colocated_pushes_only_updated_levels(sleep_mode):
    counted = _run("colocated", (1, 15), 16, sleep_mode=sleep_mode)
    assert counted[1] == {"perf/weight_syncs/ll": 1.0, "perf/weight_syncs/hl": 0.0}
    assert counted[15] == {"perf/weight_syncs/ll": 0.0, "perf/weight_syncs/hl": 1.0}


def test_under_colocated_sleep_mode_the_idle_level_sleeps_at_level_1_and_wakes_without_a_push():
    """(tH, tL) = (1, 15): at the LL's steps the HL sleeps keeping its weights (level 1) and is woken, not pushed;
    at step 15 it is updated, so its sleep discards them (level 2) and the validation pushes the new ones. Before
    issue 43 (item 7) every sleep was verl's level 2 and the idle HL was pushed once per step (16 in all, not 2)."""
    groups = {}
    counted = _run("colocated", (1, 15), 16, groups=groups)
    hl = groups["hl"].checkpoint_manager.calls
    sleeps = [level for call, level in hl if call == "sleep"]
    assert sleeps == [1] * 14 + [2, 1]  # steps 1-14 and 16 update the LL only, step 15 the HL
    assert hl[:3] == [("push", 0), ("sleep", 1), ("wake", None)]  # step 0; step 1's sleep and validation
    assert sum(pushes["perf/weight_syncs/hl"] for pushes in counted.values()) == 2  # the initial weights, step 15's
    ll = [level for call, level in groups["ll"].checkpoint_manager.calls if call == "sleep"]
    assert ll == [2] * 14 + [1, 2]
    assert keeps_weights_asleep("hl", ["ll"]) and not keeps_weights_asleep("ll", ["ll"])


@pytest.mark.parametrize("placement", ["split", "colocated"])
def test_the_snapshot_is_pushed_only_after_a_refresh_and_never_sleeps(placement):
    groups = {}
    counted = _run(placement, (1, 1), 7, reg_gap=3, groups=groups)
    snapshot = [counted[step][f"perf/weight_syncs/{SNAPSHOT}"] for step in range(8)]
    assert snapshot == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]  # step 0: the initial weights; refreshes at 3, 6
    assert not any(call == "sleep" for call, _ in groups[SNAPSHOT].checkpoint_manager.calls)
    assert ("sleep", 2) in groups["ll"].checkpoint_manager.calls


def test_a_level_sleeps_only_when_the_steps_training_uses_its_devices():
    assert sleeps_for_training("ll", ["ll"], "split", reads_other_levels=False)
    assert not sleeps_for_training("hl", ["ll"], "split", reads_other_levels=False)  # its devices stay idle
    assert sleeps_for_training("hl", ["ll"], "colocated", reads_other_levels=False)  # the LL trains on them
    assert sleeps_for_training("ll", ["hl"], "split", reads_other_levels=True)  # the confidence term reads the LL
    assert not sleeps_for_training("ll", [], "colocated", reads_other_levels=False)  # nothing trains
    assert not sleeps_for_training(SNAPSHOT, ["ll", "hl"], "colocated", reads_other_levels=True)


def test_sync_time_is_the_push_and_the_levels_push_side_by_side_under_split():
    for placement, slowest in (("split", 0.9), ("colocated", None)):
        groups = {level: _group(level, push_s=0.5) for level in ("ll", "hl")}
        weights = RolloutWeights(groups, placement, reads_other_levels=False)
        start = time.perf_counter()
        weights.wake(1)
        elapsed = time.perf_counter() - start
        if slowest:
            assert elapsed < slowest, elapsed  # the two 0.5 s pushes overlap
        else:
            assert elapsed >= 1.0, elapsed  # colocated levels share processes: one after the other
        timing = weights.take()
        assert all(timing[f"timing_s/sync_{level}"] >= 0.5 for level in groups), timing
        weights.wake(2)  # both hold their weights: no push, no sync time
        assert weights.take() == {
            **{f"perf/weight_syncs/{level}": 0.0 for level in groups},
            **{f"timing_s/sync_{level}": 0.0 for level in groups},
        }
