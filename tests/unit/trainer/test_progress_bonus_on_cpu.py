"""What the stage-II progress bonus α(R3 − R1) does to the solver's policy gradient (issue 34, item 7), measured by the
gradient, not by per-row rewards.

A tabular solver: a first attempt is right with probability p1 = σ(θ1); a refinement of a right attempt is right with
p_c = σ(θc), of a wrong one with p_w = σ(θw). Every outcome of n attempts (one refinement each) is enumerated with
its probability, its rows go through ``level_advantages`` (the function the trainer calls), and the expected policy
gradient is Σ_outcomes P · Σ_rows advantage · ∇ log π(row's answer | row's state): exact, no sampling.

* turn 3: R1 is part of the state, so −αR1 adds nothing to the expected gradient; under REINFORCE the bonus is a
  (1 + α) scale of R3's gradient; under GRPO by problem the scale is normalised away and the spread of −αR1
  across attempts reweights the turn-3 gradient.
* turn 1 (the fix): the bonus is credited to the attempt too, as SCoRe does, so the turn-1 gradient is that of
  E[R1 + α(R3 − R1)]; it used to be that of E[R1] whatever α.
"""

import itertools

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig

from agent_system.trainer import advantages as adv
from agent_system.trainer.advantages import Stage
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores

P1, PC, PW = 0.6, 0.8, 0.5  # σ(θ1), σ(θc), σ(θw)
ALPHA = 10.0


def _expected_gradient(alpha: float, estimator: str, n: int) -> np.ndarray:
    """E[Σ_rows A · ∇ log π] over (θ1, θc, θw) for one problem with n attempts and one refinement each."""
    mlmt = OmegaConf.create(
        {"ll": {"adv_estimator": estimator, "turn3_group_by": "problem"}, "stages": {"kl_in": "loss"}}
    )
    stage = Stage(stage_id=2, beta_turn1=0.0, beta_turn2=0.0, beta_turn3=0.0, alpha=alpha)
    rows = RowKeys(
        problem=np.zeros(2 * n, dtype=int),
        attempt=np.tile(np.arange(n), 2),
        feedback=np.zeros(2 * n, dtype=int),
        turn=np.repeat([1, 3], n),
    )
    mask = torch.ones(2 * n, 3, dtype=torch.long)
    gradient = np.zeros(3)
    for outcome in itertools.product([0.0, 1.0], repeat=2 * n):
        r1, r3 = np.array(outcome[:n]), np.array(outcome[n:])
        p3 = np.where(r1 == 1, PC, PW)
        probability = np.prod(np.where(r1 == 1, P1, 1 - P1)) * np.prod(np.where(r3 == 1, p3, 1 - p3))
        scores = StepScores(r1=r1[None, :], r3=r3[None, :, None])
        inputs = LevelInputs(kl=np.zeros(2 * n), response_mask=mask)
        result = adv.level_advantages(
            level="ll", rows=rows, scores=scores, stage=stage, mlmt=mlmt, algorithm=AlgoConfig(), inputs=inputs
        )
        advantage = result.advantages[:, 0].double().numpy()
        for i in range(n):
            gradient[0] += probability * advantage[i] * (r1[i] - P1)  # turn-1 row: ∂ log π / ∂θ1
            which = 1 if r1[i] == 1 else 2  # turn-3 row: ∂ log π / ∂θc or ∂θw, by the attempt it refines
            gradient[which] += probability * advantage[n + i] * (r3[i] - p3[i])
    return gradient


def test_turn3_bonus_is_a_one_plus_alpha_scale_under_reinforce():
    without, with_bonus = _expected_gradient(0.0, "reinforce", 1), _expected_gradient(ALPHA, "reinforce", 1)
    # R3's own gradient at turn 3: p(1 − p) on each refinement branch, weighted by how often the branch is reached
    np.testing.assert_allclose(without[1:], [P1 * PC * (1 - PC), (1 - P1) * PW * (1 - PW)])
    # −αR1 contributes nothing: the turn-3 gradient with the bonus is (1 + α) times R3's
    np.testing.assert_allclose(with_bonus[1:], (1 + ALPHA) * without[1:])


def test_turn3_bonus_reweights_the_turn3_gradient_under_grpo_by_problem():
    # grpo normalises the (1 + α) scale away; what is left is the −αR1 spread across the problem's attempts, which
    # enters the group's mean and std and so changes the turn-3 gradient by different factors on the two branches
    without, with_bonus = _expected_gradient(0.0, "grpo", 2), _expected_gradient(ALPHA, "grpo", 2)
    assert np.all(without[1:] > 0) and np.all(with_bonus[1:] > 0)  # same direction on each branch
    ratio = with_bonus[1:] / without[1:]
    assert abs(ratio[0] - ratio[1]) > 0.2, ratio  # not a scale: a reweighting that depends on the other attempts


@pytest.mark.parametrize("estimator", ["reinforce", "grpo"])
def test_turn1_gets_the_gradient_of_the_progress_bonus(estimator):
    # the exact gradient of E[R1 + α(R3 − R1)] w.r.t. θ1 at fixed turn-3 behaviour: p1(1 − p1)·(1 + α(p_c − 1 − p_w))
    n = 1 if estimator == "reinforce" else 2
    without, with_bonus = _expected_gradient(0.0, estimator, n), _expected_gradient(ALPHA, estimator, n)
    if estimator == "reinforce":
        np.testing.assert_allclose(without[0], P1 * (1 - P1))
        np.testing.assert_allclose(with_bonus[0], P1 * (1 - P1) * (1 + ALPHA * (PC - 1 - PW)))
    # a right attempt cannot be improved on: the bonus pulls turn 1 away from attempts its refinement merely keeps
    # (before the fix the turn-1 gradient was R1's whatever α: positive here)
    assert without[0] > 0 and with_bonus[0] < 0, (without, with_bonus)
