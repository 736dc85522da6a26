"""The feedback writer learns while the solver learns, over seeds, with negative controls (issue 34): the relay task
(agent_system/demos/relay.py) through ``python -m verl.trainer.main_mlmt``, both levels at lr 1e-4.

Marked ``study``: the per-commit run leaves it out (tests/conftest.py); run it with
``MLMT_TEST_SET=study bash scripts/run_tests.sh`` (18 runs, about 25 min on an idle machine; seeds 0-2, or those of
``MLMT_STUDY_SEEDS``, e.g. ``MLMT_STUDY_SEEDS=3,4,5`` for seeds the study was not designed on). The
per-commit tier runs one seed of (1, 1) with these assertions
(test_learning_levels_on_cpu.py::test_feedback_writer_learns_while_the_solver_learns). Figures: docs/MEASUREMENTS.md,
"Learning tests".

Per seed (its own golds, warm-ups and data order):

* ``schedule_1_1`` ((tH, tL) = (1, 1)) and ``schedule_1_2`` (``mlmt.schedule.tH=1 tL=2``: the solver on two steps
  of three, the feedback writer on the third): the HL's useful-feedback rate (its feedback, graded as an answer, is
  right) and R3 rise by at least ``RISE`` (mean of the last three steps against the first three).
* ``negated`` (plugin_negated_grpo.py: the HL's advantages minus GRPO's) and ``no_sync`` (plugin_skip_hl_sync.py:
  the HL's rollout server never receives its updated weights): neither rises so.
* ``permuted`` (agent_system/demos/permuted_grpo.py, the null control, also the relay demo's: GRPO on the HL's
  rewards shuffled within each group, as much reward as often, none of it earned by the feedback): the seed's
  ``schedule_1_1`` run (the same run, shared by both tests) rises in useful feedback by at least ``RISE`` more than
  the null does. Paired, not a bound on the null's own rise: the shuffle gives each row an expected advantage of 0,
  so the HL's logits walk without drift, but the useful-feedback rate is a sigmoid of them, convex below 0.5, and a
  spread growing around a start near 0.27 lifts its mean (the null moved -0.10 to +0.28 over seeds 0-5, crossing
  the 0.25 bound on seed 2; docs/MEASUREMENTS.md). R3 is not compared: the solver's own reward is real in the null
  too, so it learns to copy the useful feedback the walk happens to write.
* Every run: the solver is right on at most 10 % of the rows whose feedback does not pass the gold on (pooled over the
  second half): its answers come through the feedback. Each run prints its turn-1 accuracy (R1) beside R3.
* ``contrastive`` (``mlmt.reward.hl_reward=contrastive``, a lagged snapshot of the solver refining the same
  (x, z, g)): the useful-feedback rate rises. Every attempt of this task is the same "No idea", so a reward that
  credited the attempt would be the same for all m feedbacks on it and give the HL no signal; and the reference's
  score follows the feedback it was given (right on useful feedback far more often than on the rest), which a
  reference refining without the feedback could not do (the solver never answers unhelped).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlmt_run import trajectories
from relay_task import relay_run

from agent_system.demos.relay import PERMUTED_CONTROL, rise, rises, second_half, step_figures, useful

pytestmark = [pytest.mark.e2e, pytest.mark.study]

SEEDS = [int(seed) for seed in os.environ.get("MLMT_STUDY_SEEDS", "0,1,2").split(",")]

# the rise asserted (last three steps against the first three), set before the study ran, as per commit. On the
# relay task of 28b5e68 (32 problems, two-digit codes) every positive run rose 0.41-0.55 in useful feedback and the
# controls at most 0.03 (R3: at most 0.12, no_sync seed 0, as its solver learned to copy); figures in
# docs/MEASUREMENTS.md. The bound was not changed. The null's paired criterion (its positive run's rise above its own)
# reuses it; it was set after the null had run on seeds 0-5 (paired gaps +0.28 to +0.66 on seeds 2-5) and is checked
# on the study's reruns, not tuned on them.
RISE = 0.25
STEPS = {"schedule_1_2": 36}  # the HL updates on every third step: 12 updates, as (1, 1) makes in 12 steps
CONDITIONS = {
    "schedule_1_1": [],
    "schedule_1_2": ["mlmt.schedule.tH=1", "mlmt.schedule.tL=2"],
    "negated": ["mlmt.plugins=[plugin_negated_grpo]", "mlmt.hl.adv_estimator=negated_grpo"],
    "no_sync": ["mlmt.plugins=[plugin_skip_hl_sync]"],
    "permuted": PERMUTED_CONTROL,
    "contrastive": ["mlmt.reward.hl_reward=contrastive", "mlmt.reward.contrastive_lambda=1.0"],
}


@pytest.fixture
def study_run(relay_models, built_once, tmp_path):
    """``study_run(seed, condition)``: (out folder, {step: metrics}, per-step figures) of the condition's run on the
    seed's relay task; ``schedule_1_1`` runs once per seed and pytest run, shared by its own test and the null's
    (``built_once``: across xdist workers)."""

    def train(folder, seed, condition):
        steps = STEPS.get(condition, 14)
        out = folder / "run"
        label = f"seed {seed} {condition}"
        metrics, figures = relay_run(out, relay_models(seed), seed, steps, CONDITIONS[condition], label)
        return {"out": str(out), "metrics": metrics, "figures": figures}

    def run(seed, condition):
        if condition == "schedule_1_1":
            result = built_once(f"relay_positive_{seed}", lambda folder: train(folder, seed, condition))
        else:
            result = train(tmp_path, seed, condition)
        return Path(result["out"]), {int(s): m for s, m in result["metrics"].items()}, result["figures"]

    return run


@pytest.mark.parametrize("condition", list(CONDITIONS))
@pytest.mark.parametrize("seed", SEEDS)
def test_feedback_writer_learns_only_with_its_signal(seed, condition, study_run):
    steps = STEPS.get(condition, 14)
    out, metrics, figures = study_run(seed, condition)
    helped, r3 = [f["useful"] for f in figures], [f["R3"] for f in figures]
    gap = "hl/rollout_actor_logprob_diff_max"  # logged on the steps that update the HL
    sync_gap = [metrics[s][gap] for s in sorted(metrics)[1:] if gap in metrics[s]]
    # every run: the solver's right answers come through the feedback (it has not learned the golds itself)
    late = second_half(out, steps)
    assert step_figures(late)["right_unhelped"] <= 0.1, step_figures(late)
    if condition == "permuted":
        positive = [f["useful"] for f in study_run(seed, "schedule_1_1")[2]]
        print(f"seed {seed}: useful feedback rose {rise(positive):+.2f} (schedule_1_1), {rise(helped):+.2f} (permuted)")
        assert rise(positive) - rise(helped) >= RISE, (positive, helped)
    elif condition == "negated":
        assert not rises(helped, RISE) and not rises(r3, RISE), (helped, r3)
    elif condition == "no_sync":
        assert max(sync_gap) > 1e-3, sync_gap  # the fault acted: the HL's server samples with stale weights
        assert not rises(helped, RISE) and not rises(r3, RISE), (helped, r3)
    else:
        assert max(sync_gap) < 1e-3, sync_gap
        assert rises(helped, RISE) and rises(r3, RISE), (helped, r3)
    if condition == "contrastive":
        records = [r for s in range(1, len(figures) + 1) for r in trajectories(out, s)]
        reference = {True: [], False: []}
        for r in records:
            reference[useful(r["feedback"], r["ground_truth"])].append(r["R_ref"])
        with_useful, without = (sum(v) / len(v) for v in (reference[True], reference[False]))
        print(f"R_ref on useful feedback {with_useful:.2f}, on the rest {without:.2f}")
        assert with_useful >= without + 0.3, (with_useful, without)
