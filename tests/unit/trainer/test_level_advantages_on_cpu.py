"""The advantages a level is updated with (``advantages.level_advantages``, the function the trainer calls).

With ``mlmt.stages.kl_in=advantage`` β·KL is applied after the estimator, so each β acts in proportion to β (issue 8,
defect 4); with ``kl_in=loss`` the advantages are the task advantages and each row carries its turn's β to the
actor's loss (the loss itself: test_turn_kl_loss_on_cpu.py). An HL reward whose
shaping term is constant inside the HL's group gives exactly the advantages of S2 = R3, while the contrastive
reward with a per-feedback reference (lagged snapshot) does not (defect 3).
"""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig

from agent_system.trainer import advantages as adv
from agent_system.trainer.advantages import Stage
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores

# one problem, n = 2 attempts, m = 2 feedbacks each
N, M = 2, 2
LL_ROWS = {
    "problem": [0, 0, 0, 0, 0, 0],
    "attempt": [0, 1, 0, 0, 1, 1],
    "feedback": [0, 0, 0, 1, 0, 1],
    "turn": [1, 1, 3, 3, 3, 3],
}
HL_ROWS = {"problem": [0, 0, 0, 0], "attempt": [0, 0, 1, 1], "feedback": [0, 1, 0, 1], "turn": [2, 2, 2, 2]}


def _mlmt(ll="grpo", hl="grpo", hl_reward="r3", group_by="problem", lam=0.5, kl_in="advantage"):
    return OmegaConf.create(
        {
            "ll": {"adv_estimator": ll, "turn3_group_by": group_by},
            "hl": {"adv_estimator": hl},
            "reward": {"hl_reward": hl_reward, "contrastive_lambda": lam},
            "stages": {"kl_in": kl_in},
        }
    )


def _mask(rows):
    count = len(rows["turn"])
    mask = torch.ones(count, 5, dtype=torch.long)
    mask[::2, 3:] = 0  # rows of different lengths
    return mask


def _stage(stage_id=2, beta_turn1=0.0, beta_turn2=0.0, beta_turn3=0.0, alpha=0.0):
    return Stage(stage_id=stage_id, beta_turn1=beta_turn1, beta_turn2=beta_turn2, beta_turn3=beta_turn3, alpha=alpha)


def _per_row(advantages, mask):
    rows = []
    for row, m in zip(advantages, mask, strict=True):
        valid = row[m.bool()]
        torch.testing.assert_close(valid, torch.full_like(valid, valid[0].item()))
        rows.append(valid[0].item())
    return np.array(rows)


def _advantages(level, rows, scores, kl, stage, mlmt, mask, values=None):
    inputs = LevelInputs(kl=kl, response_mask=mask, values=values)
    return adv.level_advantages(
        level=level, rows=RowKeys(**rows), scores=scores, stage=stage, mlmt=mlmt, algorithm=AlgoConfig(), inputs=inputs
    )


def _run(level, scores, kl, stage, mlmt, rows=None, values=None):
    rows = rows or (LL_ROWS if level == "ll" else HL_ROWS)
    mask = _mask(rows)
    kl = np.asarray(kl, dtype=float)
    result = _advantages(level, rows, scores, kl, stage, mlmt, mask, values)
    return _per_row(result.advantages, mask), result, mask


SCORES = StepScores(r1=np.array([[0.0, 1.0]]), r3=np.array([[[1.0, 0.0], [1.0, 1.0]]]))
LL_KL = [0.3, 0.9, 0.1, 0.4, 2.0, 0.0]
HL_KL = [0.5, 0.2, 1.5, 0.1]


# ---------------------------------------------------------------- β acts in proportion to β


# LL_ROWS' task rewards under SCORES, by hand: turn 1 gets 0 (stage I) or R1 = [0, 1] plus α(R̄3 − R1) (the mean R3
# of the attempt's refinements: [0.5, 1]); turn 3 gets R3 = [1, 0, 1, 1] plus, in stage II, α(R3 − R1); α = 0.5
# (attempt 0 has R1 = 0, attempt 1 has R1 = 1)
TASK_REWARDS = {1: [0.0, 0.0, 1.0, 0.0, 1.0, 1.0], 2: [0.25, 1.0, 1.5, 0.0, 1.0, 1.0]}
LL_GROUPS = [[0, 1], [2, 3, 4, 5]]  # the turn-1 rows and the turn-3 rows of the one problem
ESTIMATORS = ["grpo", "rloo", "reinforce", "reinforce_plus_plus", "gae"]  # built-in (advantages.estimator_names)


def _values(mask):
    """Critic values (B, R) that differ by row and token, for gae."""
    return torch.linspace(-0.4, 0.7, mask.numel()).reshape(mask.shape)


def _expected_token_advantages(estimator, rewards, mask, values, stage_id):
    """The advantage of each response token, computed here from the estimators' definitions (γ = λ = 1)."""
    rewards, mask, values = np.asarray(rewards), mask.numpy().astype(bool), values.numpy().astype(np.float64)
    out = np.zeros(mask.shape)
    for rows in LL_GROUPS:
        r = rewards[rows]
        if estimator == "grpo":  # (r − group mean) / (group std, n − 1 in the denominator + 1e-6)
            per_row = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        elif estimator == "rloo":  # r − the mean of the group's other rows
            per_row = np.array([r[i] - np.delete(r, i).mean() for i in range(len(r))])
        elif estimator == "reinforce":
            per_row = r
        if estimator in ("grpo", "rloo", "reinforce"):
            out[rows] = per_row[:, None]
            continue
        # reinforce_plus_plus: the return R on every token; gae with γ = λ = 1: R − V(token). Whitened over the
        # tokens of this turn's rows only (mean, variance with n − 1, + 1e-8)
        raw = np.repeat(r[:, None], mask.shape[1], axis=1)
        if estimator == "gae":
            raw = raw - values[rows]
        tokens = raw[mask[rows]]
        out[rows] = (raw - tokens.mean()) / np.sqrt(tokens.var(ddof=1) + 1e-8)
    if stage_id == 1:
        out[LL_GROUPS[0]] = 0.0  # stage I: turn 1 has no task reward, so no task advantage
    return out


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("stage_id", [1, 2])
def test_beta_zero_gives_each_estimators_own_advantages_turn_by_turn(estimator, stage_id):
    mlmt = _mlmt(ll=estimator)
    mask = _mask(LL_ROWS)
    values = _values(mask)
    stage = _stage(stage_id, alpha=0.5)
    result = _advantages("ll", LL_ROWS, SCORES, np.asarray(LL_KL), stage, mlmt, mask, values)
    np.testing.assert_allclose(result.task_rewards, TASK_REWARDS[stage_id])
    expected = _expected_token_advantages(estimator, TASK_REWARDS[stage_id], mask, values, stage_id)
    got = result.advantages.numpy()
    np.testing.assert_allclose(got[mask.bool().numpy()], expected[mask.bool().numpy()], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result.kl_penalty, 0.0)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kl_in", ["loss", "advantage"])
def test_stage_one_turn1_rows_get_only_their_kl_term(estimator, kl_in):
    # issue 16, item 3: task rewards [0, 0, 1, 1, 1, 0]; reinforce_plus_plus gave every turn-1 row −0.983
    scores = StepScores(r1=np.array([[1.0, 0.0]]), r3=np.array([[[1.0, 1.0], [1.0, 0.0]]]))
    mask = _mask(LL_ROWS)
    values = _values(mask)
    stage = _stage(1, beta_turn1=0.1, beta_turn3=0.05)
    mlmt = _mlmt(ll=estimator, kl_in=kl_in)
    result = _advantages("ll", LL_ROWS, scores, np.asarray(LL_KL), stage, mlmt, mask, values)
    np.testing.assert_allclose(result.task_rewards, [0, 0, 1, 1, 1, 0])
    # kl_in=loss: the KL is in the actor's loss (β on turn 1), the advantage is 0; kl_in=advantage: −β·(KL − KL of
    # the other turn-1 row) = −0.1·(0.3 − 0.9), −0.1·(0.9 − 0.3), on every response token
    got = _per_row(result.advantages[:2], mask[:2])
    np.testing.assert_allclose(got, [0.0, 0.0] if kl_in == "loss" else [0.06, -0.06], atol=1e-6)
    np.testing.assert_allclose(result.kl_coef[:2], 0.1)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_stage_two_turn1_advantages_do_not_depend_on_the_turn3_rewards(estimator):
    # issue 16, item 3: with batch whitening the spread of the turn-3 rewards scaled the turn-1 advantages (α = 0
    # here: α > 0 credits R̄3 to turn 1 on purpose, test_progress_bonus_on_cpu.py)
    mask = _mask(LL_ROWS)
    values = _values(mask)
    turn1 = []
    for r3 in ([[1.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]]):
        scores = StepScores(r1=np.array([[0.0, 1.0]]), r3=np.array([r3]))
        stage, mlmt = _stage(2), _mlmt(ll=estimator)
        result = _advantages("ll", LL_ROWS, scores, np.zeros(6), stage, mlmt, mask, values)
        turn1.append(result.advantages[:2])
    torch.testing.assert_close(turn1[0] * mask[:2], turn1[1] * mask[:2])
    assert (turn1[0] * mask[:2]).abs().max() > 0.1  # R1 = [0, 1]: turn 1 has a signal of its own


@pytest.mark.parametrize("level", ["ll", "hl"])
@pytest.mark.parametrize("stage_id", [1, 2])
def test_kl_part_scales_linearly_with_beta(level, stage_id):
    kl = LL_KL if level == "ll" else HL_KL
    base, _, _ = _run(level, SCORES, kl, _stage(stage_id), _mlmt())
    parts = []
    for beta in (1e-3, 1e-2, 1e-1, 1.0):
        stage = _stage(
            stage_id, beta_turn1=(2 if stage_id == 1 else 1) * beta, beta_turn2=4 * beta, beta_turn3=3 * beta
        )
        got, _, _ = _run(level, SCORES, kl, stage, _mlmt())
        parts.append((got - base) / beta)
    for part in parts[1:]:
        np.testing.assert_allclose(part, parts[0], rtol=1e-4, atol=1e-6)
    # and it is −β·(KL − leave-one-out mean KL of the turn's other rows) with that turn's β per unit β
    turn = np.array((LL_ROWS if level == "ll" else HL_ROWS)["turn"])
    unit = np.select([turn == 1, turn == 2, turn == 3], [2.0 if stage_id == 1 else 1.0, 4.0, 3.0])
    kl = np.array(kl)
    centred = np.array(
        [kl[i] - np.mean([kl[j] for j in range(len(kl)) if j != i and turn[j] == turn[i]]) for i in range(len(kl))]
    )
    np.testing.assert_allclose(parts[0], -unit * centred, rtol=1e-3, atol=1e-6)


def test_small_beta_in_an_equal_reward_group_stays_small():
    # issue 8: a turn-1 β = 1e-3 (stage II) with a 0.01 KL difference in a group of equal task reward gave ±0.62
    # (divided by the std)
    scores = StepScores(r1=np.array([[1.0, 1.0]]), r3=np.array([[[1.0, 1.0], [1.0, 1.0]]]))
    kl = [0.50, 0.51, 0.0, 0.0, 0.0, 0.0]
    got, _, _ = _run("ll", scores, kl, _stage(2, beta_turn1=1e-3), _mlmt())
    np.testing.assert_allclose(got[:2], [1.0e-5, -1.0e-5], rtol=1e-3)  # −β·(KL − the other row's KL)
    assert np.abs(got).max() < 1e-3


def test_stage_one_turn1_advantage_is_minus_beta_kl():
    # issue 8: stage-I turn 1 gave ≈ ±0.707 whatever its β was; now the row with more KL is pushed down, by β·ΔKL
    for beta in (0.01, 0.1):
        got, _, _ = _run("ll", SCORES, LL_KL, _stage(1, beta_turn1=beta), _mlmt())
        np.testing.assert_allclose(got[:2], [beta * 0.6, -beta * 0.6], rtol=1e-4)


@pytest.mark.parametrize("level", ["ll", "hl"])
@pytest.mark.parametrize("stage_id", [1, 2])
def test_kl_in_loss_leaves_the_task_advantages_and_carries_each_turns_beta(level, stage_id):
    kl = LL_KL if level == "ll" else HL_KL
    base, _, _ = _run(level, SCORES, kl, _stage(stage_id), _mlmt(kl_in="loss"))
    stage = _stage(stage_id, beta_turn1=0.2 if stage_id == 1 else 0.1, beta_turn2=0.4, beta_turn3=0.3)
    got, result, _ = _run(level, SCORES, kl, stage, _mlmt(kl_in="loss"))
    np.testing.assert_allclose(got, base, atol=1e-6)
    np.testing.assert_allclose(result.kl_penalty, 0.0)
    turn = np.array((LL_ROWS if level == "ll" else HL_ROWS)["turn"])
    expected = np.select([turn == 1, turn == 2, turn == 3], [0.2 if stage_id == 1 else 0.1, 0.4, 0.3])
    np.testing.assert_allclose(result.kl_coef, expected)


def test_a_single_row_of_a_turn_keeps_its_raw_kl():
    advantages = torch.zeros(1, 3)
    shaped, penalty = adv.apply_kl_penalty(advantages, np.array([2.0]), np.array([0.5]), torch.ones(1, 3), [1])
    np.testing.assert_allclose(penalty, [1.0])
    torch.testing.assert_close(shaped, torch.full((1, 3), -1.0))


# ---------------------------------------------------------------- HL rewards inside the HL's group

R3_PAIR = StepScores(r1=np.array([[0.0, 1.0]]), r3=np.array([[[1.0, 0.0], [1.0, 0.0]]]))


def test_progress_and_no_feedback_contrastive_cancel_inside_the_hl_group():
    """The measured defect: with HL GRPO these shapings are constant per group, so the advantages equal r3's.

    This is why config.validate_config rejects them (test_config_on_cpu.py); the fact is kept here as the reason.
    """
    r3_adv, _, _ = _run("hl", R3_PAIR, [0] * 4, _stage(2, alpha=1.0), _mlmt(hl_reward="r3"))
    np.testing.assert_allclose(np.abs(r3_adv), 1 / np.sqrt(2), rtol=1e-4)
    progress, _, _ = _run("hl", R3_PAIR, [0] * 4, _stage(2, alpha=1.0), _mlmt(hl_reward="progress"))
    scores = StepScores(
        r1=R3_PAIR.r1, r3=R3_PAIR.r3, r_ref_attempt=np.array([[1.0, 0.0]])
    )  # the no-feedback refinement
    contrastive, _, _ = _run("hl", scores, [0] * 4, _stage(2), _mlmt(hl_reward="contrastive"))
    np.testing.assert_allclose(progress, r3_adv, atol=1e-5)
    np.testing.assert_allclose(contrastive, r3_adv, atol=1e-5)


def test_contrastive_with_a_per_feedback_reference_differs_from_r3():
    # lagged snapshot: R_ref per (x, z, g). Attempt 0: both feedbacks help the current LL (R3 = 1, 1) but only the
    # first also helps the stale solver; attempt 1: R3 = [1, 0] with R_ref = [0, 1]
    scores = StepScores(
        r1=np.array([[0.0, 0.0]]),
        r3=np.array([[[1.0, 1.0], [1.0, 0.0]]]),
        r_ref_feedback=np.array([[[1.0, 0.0], [0.0, 1.0]]]),
    )
    got, result, mask = _run("hl", scores, [0] * 4, _stage(2), _mlmt(hl_reward="contrastive", lam=1.0))
    r3_adv = _per_row(result.r3_advantages, mask)
    np.testing.assert_allclose(r3_adv[:2], [0.0, 0.0], atol=1e-5)  # equal R3: no signal from r3
    assert got[1] > got[0]  # the feedback that helps the current solver more than the stale one is preferred
    assert np.abs(got - r3_adv).max() > 0.1


def test_ll_alpha_cancels_on_turn3_grouped_by_attempt_and_acts_on_turn1():
    """With turn-3 groups = the m refinements of one attempt, R1 is constant in the group: α changes no turn-3
    advantage; it acts on the turn-1 rows (grouped by problem), which get R1 + α(R̄3 − R1)."""
    scores = StepScores(r1=np.array([[0.0, 1.0]]), r3=np.array([[[1.0, 0.0], [1.0, 0.0]]]))
    plain, _, _ = _run("ll", scores, [0] * 6, _stage(2, alpha=0.0), _mlmt(group_by="attempt"))
    shaped, _, _ = _run("ll", scores, [0] * 6, _stage(2, alpha=2.0), _mlmt(group_by="attempt"))
    np.testing.assert_allclose(shaped[2:], plain[2:], atol=1e-5)
    # turn 1: R1 = [0, 1] → [0 + 2·0.5, 1 + 2·(0.5 − 1)] = [1, 0]: the GRPO sign of the two attempts flips
    assert plain[0] < 0 < plain[1] and shaped[1] < 0 < shaped[0], (plain, shaped)
    by_problem, _, _ = _run("ll", scores, [0] * 6, _stage(2, alpha=2.0), _mlmt(group_by="problem"))
    assert np.abs(by_problem[2:] - plain[2:]).max() > 0.1  # grouped by problem, α acts


def test_groups_with_signal_counts_the_groups_whose_rows_were_scored_apart():
    # HL groups are the m feedbacks on one attempt: attempt 0's refinements scored 1 and 0 (a signal), attempt 1's
    # 1 and 1 (none); all four alike leaves no group with a signal, and the share is the trainer's
    # hl/groups_with_signal
    _, mixed, _ = _run("hl", SCORES, HL_KL, _stage(), _mlmt())
    assert mixed.groups_with_signal == 0.5
    uniform = StepScores(r1=np.array([[0.0, 1.0]]), r3=np.array([[[1.0, 1.0], [1.0, 1.0]]]))
    _, flat, _ = _run("hl", uniform, HL_KL, _stage(), _mlmt())
    assert flat.groups_with_signal == 0.0
    # the β·KL of kl_in=advantage moves every row, but it is not a task signal
    _, penalised, _ = _run("hl", uniform, HL_KL, _stage(beta_turn2=1.0), _mlmt())
    assert penalised.groups_with_signal == 0.0
