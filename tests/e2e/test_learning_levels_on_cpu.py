"""The method learns at both levels (issue 8): the cue task (cue_task.py) through `python -m verl.trainer.main_mlmt`.

* **The HL learns to help**, with the solver frozen (``mlmt.ll.freeze=true``). The solver answers right only when
  the feedback contains a digit; the feedback writer starts from random weights. Its reward R3 must rise from its
  starting rate (about 0.25-0.5; asserted in [0.1, 0.5]) to >= 0.8, and its cue rate to >= 0.8.
* **Both levels at once, the solver learning** under the (1, 1) schedule: the solver starts right with probability
  0.65 when cued; turn-3 accuracy must rise, and that probability by at least 0.2. The feedback writer does not
  learn reliably in this run (see the test's docstring).
* **The HL learns while the solver learns**, both at lr 1e-4 under (1, 1), on the relay task
  (agent_system/demos/relay.py: the feedback writer knows the two-digit codes of 32 problems, the solver copies a
  number from the feedback): one seed of the multi-seed study with its negative controls
  (test_joint_learning_study_on_cpu.py, marked ``study``); the recipe recipes/relay_demo/ runs it beside its null
  control for a user.
"""

from __future__ import annotations

import numpy as np
import pytest
from cue_task import has_cue, right_given_cue_rate
from mlmt_run import HF_TOY_RUN, run_main, trajectories
from relay_task import relay_run

from agent_system.demos.relay import problems as relay_problems
from agent_system.demos.relay import rises, second_half, solver_rates, step_figures
from agent_system.launcher.export import export_checkpoint

pytestmark = pytest.mark.e2e

COMMON = [
    "data.train_batch_size=2",
    "data.max_response_length=6",
    "hl.rollout.response_length=4",
    "mlmt.n=2",
    "mlmt.m=8",
    "hl.actor.optim.lr=1e-2",
    "data.seed=0",
    *HF_TOY_RUN,
]


def test_feedback_writer_learns_to_emit_the_cue(cue_ll_sure, cue_hl, cue_data, tmp_path):
    """HL GRPO over the m = 8 feedbacks on each attempt, the solver frozen (``mlmt.ll.freeze=true``): R3 goes from
    ~0.25-0.5 to >= 0.8, and the cue rate to >= 0.8.

    A ``trained`` variant (both levels every step, the solver at lr 1e-5, slow enough that it did not learn to answer
    uncued within the run) ran here until issue 34; ``test_feedback_writer_learns_while_the_solver_learns`` replaces
    it with both levels at lr 1e-4 on a task where the feedback keeps mattering. Its figures, as measured:

    Measured (10 steps, fixed seeds): ``frozen`` R3 per step 0.38 0.31 0.53 0.66 0.91 0.97 1.00 1.00 0.97 1.00;
    ``trained`` R3 0.47 0.38 0.44 0.53 0.78 0.91 1.00 1.00 1.00 0.97 and cue rate 0.38 0.34 0.44 0.50 0.72 0.91
    1.00 1.00 1.00 1.00.

    14 steps, not 10: the seeds did not fix the samples then (the ``hf`` server batches requests as they arrive and
    drew from one generator; each request has its own seed now, test_reproducible_run_on_cpu.py), and the step at
    which R3 takes off varied. A CI run's ``frozen`` run took off late, R3 0.41
    0.47 0.34 0.31 0.44 0.47 0.50 0.59 0.75 0.88 (cue rate 0.31 → 0.94, the HL's server in sync with its actor to
    2e-6 at every step), and failed the last-3 bound at 0.74. Four runs at 14 steps: ``frozen`` 0.41 0.31 0.53 0.41
    0.44 0.94 0.94 1.00 ... 0.97 and 0.34 0.41 0.31 0.34 0.50 0.72 0.78 0.84 1.00 ... 1.00; ``trained`` 0.31 0.44
    0.47 0.47 0.62 0.69 0.91 0.91 1.00 ... 1.00 and 0.41 0.41 0.44 0.47 0.44 0.75 0.88 0.97 ... 1.00.

    Deliberate breaks (``frozen``), each run once (12 steps, same seeds) on a copy of the code while writing this
    test:

    * HL advantages negated: R3 0.38 0.41 0.12 0.16 0.03 ... 0.03 (last-3 mean 0.03): fails.
    * HL weight sync skipped: R3 0.38 0.38 0.34 0.44 0.28 ... 0.25 (0.30): fails; the HL's rollout/actor log-prob
      gap on its sampled tokens grows from 0 to 11.6 (the test also holds it at 0 below).
    * Every HL row its own group (a grouping bug): R3 0.41 ... 0.97: **passes**. verl's GRPO gives a group of one
      mean 0 and std 1, i.e. REINFORCE without a baseline, which also learns here; any grouping is a valid baseline
      on this task, so grouping is checked by the unit tests (test_advantages_on_cpu.py: group keys) instead.
    """
    steps = 14
    metrics = run_main(
        tmp_path / "run",
        [
            f"actor_rollout_ref.model.path={cue_ll_sure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            f"trainer.total_training_steps={steps}",
            "mlmt.ll.freeze=true",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            *COMMON,
        ],
    )
    r3 = [metrics[s]["train/acc@t3"] for s in range(1, steps + 1)]
    cue_rate = [np.mean([has_cue(r["feedback"]) for r in trajectories(tmp_path / "run", s)]) for s in (1, steps)]
    print("HL reward (R3) per step:", " ".join(f"{v:.2f}" for v in r3))
    print(f"HL cue rate, step 1 → {steps}: {cue_rate[0]:.2f} → {cue_rate[1]:.2f}")
    assert all("ll/pg_loss" not in metrics[s] and "hl/pg_loss" in metrics[s] for s in metrics)
    assert 0.1 <= r3[0] <= 0.5, r3
    assert np.mean(r3[-3:]) >= 0.8, r3
    for s in range(2, steps + 1):  # the HL's server samples with the weights it was just updated to
        assert metrics[s]["hl/rollout_actor_logprob_diff_max"] < 1e-3, (s, metrics[s])
    assert cue_rate[1] >= 0.8 > cue_rate[0], cue_rate  # the feedback writer learned to give the cue


def test_feedback_writer_learns_while_the_solver_learns(relay_models, tmp_path):
    """Both levels at lr 1e-4 on every step ((tH, tL) = (1, 1)) on the relay task, seed 0: the HL's useful-feedback
    rate and R3 rise by >= 0.25 (last three steps against the first three) while the solver learns to pass the
    feedback's code on (its probability of copying it, on prompts it was not trained on, rises by >= 0.2) and its
    answers stay tied to the feedback (right on at most 10 % of the rows whose feedback does not pass the gold on,
    pooled over the second half: it has not learned the answers itself; a late step may have no such row). The
    seeds, the (1, 2) schedule, the contrastive reward and the negative controls (the HL's advantages negated, its
    weight sync skipped, its rewards shuffled within groups: none rises so) are the ``study``
    (test_joint_learning_study_on_cpu.py); figures in docs/MEASUREMENTS.md, "Learning tests"."""
    steps, models = 14, relay_models(0)
    out = tmp_path / "run"
    metrics, figures = relay_run(out, models, 0, steps, [f"trainer.save_freq={steps}"], "seed 0 schedule_1_1")
    helped, r3 = [f["useful"] for f in figures], [f["R3"] for f in figures]
    assert all("ll/pg_loss" in metrics[s] and "hl/pg_loss" in metrics[s] for s in metrics)  # (1, 1): both, every step
    tasks = relay_problems(32, 0)
    copy = [solver_rates(path, tasks)["copy"] for path in (models["ll"], export_checkpoint(str(out))["ll"])]
    print(f"LL probability of copying the feedback's number, before → after: {copy[0]:.3f} → {copy[1]:.3f}")
    assert copy[1] >= copy[0] + 0.2, copy  # the solver's behaviour changed: it passes the feedback's code on more
    for s in range(2, steps + 1):  # the HL's server samples with the weights it was just updated to
        assert metrics[s]["hl/rollout_actor_logprob_diff_max"] < 1e-3, (s, metrics[s])
    assert rises(helped) and rises(r3), (helped, r3)
    # the rows of the second half whose feedback does not pass the gold on, pooled (a step may have none)
    late = second_half(out, steps)
    assert step_figures(late)["right_unhelped"] <= 0.1, step_figures(late)


def test_both_levels_update_and_the_solver_learns_under_the_default_schedule(cue_ll_unsure, cue_hl, cue_data, tmp_path):
    """Both levels update on every step; turn-3 accuracy rises, and the solver's greedy rate of refining to the right
    answer given a cue (on the same 64 cued feedbacks, no sampling noise: ``cue_task.right_given_cue_rate``) rises
    from before training to after by more than 0.2.

    It was the exact probability of the one string "The answer is 3" given a cue until a CI run (7ab030a) measured
    0.084 → 0.264 and failed: the fixture's solver starts there (not at the 0.651 written here before; the same on the
    previous code), and the run teaches it to answer right in other words (turn-3 accuracy 0.12 → 0.94 in that run),
    which that one string's probability does not count. On that run's checkpoints the greedy rate is 0.34 → 1.00.

    What this run does **not** show reliably: the feedback writer learning. Its reward is R3, and on this
    single-answer task the solver also learns to answer without the cue (it already does about a third of the time at
    step 1), so the feedback can stop mattering. Measured, the HL's cue rate over 12 steps at solver lr 1e-4:
    0.31 → 0.16, 0.34 → 0.41 and 0.31 → 0.72 in three runs; 0.28 → 0.16 at 3e-5 and 0.34 → 0.19 at 1e-5, while the
    accuracy without a cue rose from 0.19-0.35 to 0.73-0.81 at the lower rates. A copy task with three problems
    (the solver fine-tuned to copy the feedback's digit, the HL to write a random one of five digits) did not fix this
    in 12 steps: the HL's right-digit rate went 0.12 → 0.19-0.31 (HL lr 1e-3), 0.23 → 0.33-0.42 (HL lr 2e-3, solver
    1e-5), and at HL lr 3e-3 the HL stopped writing digits while the solver learned the answers itself. Nor did the
    frozen-solver test's solver (fine-tuned to answer only when cued) keep the feedback necessary when it trained too
    (10 steps, solver lr 1e-4): R3 rose 0.38 → 0.94, but at step 10 it answered right on all 13 uncued rows, and the
    cue rate went only 0.31 → 0.59. So the cue rate is printed, not asserted. The HL learning the cue while the solver
    trains too is asserted on the relay task (``test_feedback_writer_learns_while_the_solver_learns``).

    Measured (12 steps, solver lr 1e-4): turn-3 accuracy 0.25 0.69 0.62 0.69 0.88 0.91 0.84 0.91 0.97 1.00 1.00 0.94,
    0.25 0.62 0.66 0.81 0.84 0.97 1.00 0.94 0.97 1.00 1.00 0.97 and 0.19 0.56 0.66 0.72 0.75 0.97 0.97 0.94 0.91 1.00
    1.00 1.00 (three earlier runs), 0.12 0.56 0.66 0.75 0.78 0.94 0.81 0.91 0.91 0.81 0.97 0.94 (7ab030a's CI), and
    0.31 0.47 0.47 ... 0.41 0.84 0.75 in a CI rehearsal that failed (a rise of 0.25) while requests had no seeds of
    their own. Seeded (``full_determinism``, in ``HF_TOY_RUN``), two runs printed the same 0.31 0.34 0.53 0.56 0.69
    0.62 0.66 0.72 0.81 0.84 0.84 0.88 (a rise of 0.46), greedy rate 0.469 → 1.000.
    """
    steps = 12
    before = right_given_cue_rate(cue_ll_unsure)
    metrics = run_main(
        tmp_path / "run",
        [
            f"actor_rollout_ref.model.path={cue_ll_unsure}",
            f"hl.model.path={cue_hl}",
            f"data.train_files={cue_data[0]}",
            f"data.val_files={cue_data[1]}",
            f"trainer.total_training_steps={steps}",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            *[o for o in COMMON if not o.startswith("trainer.save_freq=")],
            f"trainer.save_freq={steps}",
        ],
    )
    assert all("ll/pg_loss" in metrics[s] and "hl/pg_loss" in metrics[s] for s in metrics)  # (1, 1): both, every step
    records = [trajectories(tmp_path / "run", s) for s in range(1, steps + 1)]
    cue_rate = [np.mean([has_cue(r["feedback"]) for r in step]) for step in records]
    r3 = [metrics[s]["train/acc@t3"] for s in range(1, steps + 1)]
    after = right_given_cue_rate(export_checkpoint(str(tmp_path / "run"))["ll"])
    print("turn-3 accuracy:", " ".join(f"{v:.2f}" for v in r3))
    print("HL cue rate (not asserted, see the docstring):", " ".join(f"{v:.2f}" for v in cue_rate))
    print(f"LL greedy right-answer rate given a cue, before → after: {before:.3f} → {after:.3f}")
    assert np.mean(r3[-3:]) > np.mean(r3[:3]) + 0.3, r3
    assert after > before + 0.2, (before, after)
