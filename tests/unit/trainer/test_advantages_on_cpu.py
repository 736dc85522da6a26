"""Per-turn rewards, GRPO group keys, stage schedule and advantages (docs/METHOD.md), on hand-built examples."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig

from agent_system.trainer import advantages as adv
from agent_system.trainer.advantages import Stage

STAGE_I = Stage(stage_id=1, beta_turn1=0.7, beta_turn2=0.9, beta_turn3=0.2, alpha=0.5)
STAGE_II = Stage(stage_id=2, beta_turn1=0.3, beta_turn2=0.9, beta_turn3=0.2, alpha=0.5)

R1 = np.array([0.0, 1.0, 0.0, 1.0])
R3 = np.array([1.0, 1.0, 0.0, 0.0])
KL = np.array([0.5, 2.0, 1.0, 0.0])


# ---------------------------------------------------------------- per-turn rewards


def _advantages(*args, **kwargs) -> torch.Tensor:
    """The advantages of ``compute_advantages`` (it also returns the returns)."""
    return adv.compute_advantages(*args, **kwargs)[0]


def test_turn1_task_reward_is_zero_in_stage_one_and_r1_plus_the_progress_bonus_in_stage_two():
    np.testing.assert_allclose(adv.turn1_task_rewards(R1, R3, STAGE_I), [0.0, 0.0, 0.0, 0.0])
    # R1 + α(R̄3 − R1), α = 0.5 (test_progress_bonus_on_cpu.py: the gradient it gives)
    np.testing.assert_allclose(adv.turn1_task_rewards(R1, R3, STAGE_II), [0.5, 1.0, 0.0, 0.5])


def test_turn3_task_reward_is_r3_in_stage_one():
    np.testing.assert_allclose(adv.turn3_task_rewards(R1, R3, STAGE_I), R3)


def test_turn3_stage_two_adds_progress_bonus():
    # R3 + α(R3 − R1): i→c gets +α, c→i gets −α, unchanged gets 0
    np.testing.assert_allclose(adv.turn3_task_rewards(R1, R3, STAGE_II), [1.5, 1.0, 0.0, -0.5])


def test_score_returns_are_score_s_episode_return_on_both_turns():
    """mlmt.stages.returns=score: (1 − α)R1 + (1 + α)R3 on turn 3 and (1 − α)R1 + (1 + α)R̄3 on turn 1 (SCoRe's
    R1 + R2 + α(R2 − R1)); stage I is unchanged."""
    import dataclasses

    score = dataclasses.replace(STAGE_II, returns="score")
    alpha = STAGE_II.alpha
    np.testing.assert_allclose(adv.turn3_task_rewards(R1, R3, score), (1 - alpha) * R1 + (1 + alpha) * R3)
    np.testing.assert_allclose(adv.turn1_task_rewards(R1, R3, score), (1 - alpha) * R1 + (1 + alpha) * R3)
    stage_one = dataclasses.replace(STAGE_I, returns="score")
    np.testing.assert_allclose(adv.turn1_task_rewards(R1, R3, stage_one), np.zeros(4))
    np.testing.assert_allclose(adv.turn3_task_rewards(R1, R3, stage_one), R3)


def test_score_returns_are_read_from_the_config_and_refused_where_inert():
    from agent_system.config import ConfigError, compose_config
    from agent_system.launcher.main import check_config

    staged = ["mlmt.stages.schedule=[0,2]", "mlmt.stages.stage_ids=[1,2]", "mlmt.stages.alpha=[0.0,10.0]"]
    staged += [f"mlmt.stages.{key}=[0.0,0.0]" for key in ("beta_turn1", "beta_turn2", "beta_turn3")]
    config = compose_config([*staged, "mlmt.stages.returns=score"])
    check_config(config)
    assert adv.stage_at(config.mlmt.stages, 2)[1].returns == "score"
    with pytest.raises(ConfigError, match=r"mlmt.stages.returns=score shapes the returns of a stage II"):
        check_config(compose_config(["mlmt.stages.returns=score", "mlmt.stages.stage_ids=[1]"]))
    with pytest.raises(ConfigError, match=r"mlmt.stages.returns='scor': choose one of"):
        check_config(compose_config(["mlmt.stages.returns=scor"]))


def test_kl_coefficients_by_turn_and_stage():
    turns = np.array([1, 2, 3])
    np.testing.assert_allclose(adv.kl_coefficients(turns, STAGE_I), [0.7, 0.9, 0.2])  # β2, β_H, β_L
    np.testing.assert_allclose(adv.kl_coefficients(turns, STAGE_II), [0.3, 0.9, 0.2])  # β1, β_H, β_L


def test_hl_score_r3_is_r3():
    scores = adv.hl_scores(R1, R3, "r3", STAGE_II, contrastive_lambda=0.5, r_ref=None)
    np.testing.assert_allclose(scores, R3)


def test_hl_score_progress_in_stage_two():
    scores = adv.hl_scores(R1, R3, "progress", STAGE_II, contrastive_lambda=0.5, r_ref=None)
    np.testing.assert_allclose(scores, [1.5, 1.0, 0.0, -0.5])


def test_hl_score_progress_has_no_alpha_in_stage_one():
    # α is the stage-II progress bonus (README): in stage I the HL's S2 is R3
    scores = adv.hl_scores(R1, R3, "progress", STAGE_I, contrastive_lambda=0.5, r_ref=None)
    np.testing.assert_allclose(scores, R3)


def test_hl_score_contrastive():
    r_ref = np.array([1.0, 0.0, 1.0, 0.0])
    scores = adv.hl_scores(R1, R3, "contrastive", STAGE_II, contrastive_lambda=0.25, r_ref=r_ref)
    # (1 + λ)·R3 − λ·R_ref
    np.testing.assert_allclose(scores, [1.0, 1.25, -0.25, 0.0])


def test_hl_score_contrastive_without_reference_raises():
    with pytest.raises(ValueError, match="contrastive"):
        adv.hl_scores(R1, R3, "contrastive", STAGE_II, contrastive_lambda=0.5, r_ref=None)


def test_hl_score_unknown_mode_raises():
    with pytest.raises(ValueError, match="unknown hl_reward 'r4'"):
        adv.hl_scores(R1, R3, "r4", STAGE_II, contrastive_lambda=0.5, r_ref=None)


# ---------------------------------------------------------------- placement


def test_place_on_last_token():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    token_rewards = adv.place_on_last_token(np.array([0.5, -1.0, 2.0]), mask)
    expected = torch.tensor(
        [[0.0, 0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, -1.0], [2.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float32
    )
    assert token_rewards.dtype == torch.float32
    torch.testing.assert_close(token_rewards, expected)
    torch.testing.assert_close(token_rewards.sum(dim=1), torch.tensor([0.5, -1.0, 2.0]))


# ---------------------------------------------------------------- groups

# LL rows of 2 problems, n = 2 attempts, m = 2 feedbacks: 4 turn-1 rows then 8 turn-3 rows
LL_PROBLEM = [0, 0, 1, 1] + [0, 0, 0, 0, 1, 1, 1, 1]
LL_ATTEMPT = [0, 1, 0, 1] + [0, 0, 1, 1, 0, 0, 1, 1]
LL_TURN = [1, 1, 1, 1] + [3] * 8


def _partition(keys):
    """Rows grouped by key, as a set of frozensets of row indices (key spelling does not matter)."""
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, set()).add(i)
    return {frozenset(g) for g in groups.values()}


def test_group_keys_ll_turn3_by_problem():
    keys = adv.group_keys(LL_PROBLEM, LL_ATTEMPT, LL_TURN, "problem")
    assert len(keys) == 12
    assert _partition(keys) == {
        frozenset({0, 1}),  # turn 1, problem 0
        frozenset({2, 3}),  # turn 1, problem 1
        frozenset({4, 5, 6, 7}),  # turn 3, problem 0 (all n·m refinements)
        frozenset({8, 9, 10, 11}),  # turn 3, problem 1
    }


def test_group_keys_ll_turn3_by_attempt():
    keys = adv.group_keys(LL_PROBLEM, LL_ATTEMPT, LL_TURN, "attempt")
    assert _partition(keys) == {
        frozenset({0, 1}),
        frozenset({2, 3}),
        frozenset({4, 5}),  # the m refinements of problem 0 attempt 0
        frozenset({6, 7}),
        frozenset({8, 9}),
        frozenset({10, 11}),
    }


@pytest.mark.parametrize("turn3_group_by", ["problem", "attempt"])
def test_group_keys_hl_by_problem_and_attempt(turn3_group_by):
    # HL rows: 2 problems × 2 attempts × 2 feedbacks; attempt ids repeat across problems
    problem = [0, 0, 0, 0, 1, 1, 1, 1]
    attempt = [0, 0, 1, 1, 0, 0, 1, 1]
    keys = adv.group_keys(problem, attempt, [2] * 8, turn3_group_by)
    assert _partition(keys) == {frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})}


def test_group_keys_turns_never_share_a_group():
    keys = adv.group_keys([0, 0, 0], [0, 0, 0], [1, 2, 3], "attempt")
    assert len(set(keys)) == 3


def test_group_keys_length_mismatch_raises():
    with pytest.raises(ValueError):
        adv.group_keys([0, 1], [0], [1, 1], "problem")


# ---------------------------------------------------------------- stage schedule


@pytest.fixture
def stages():
    return OmegaConf.create(
        {
            "schedule": [0, 10, 25],
            "stage_ids": [1, 2, 2],
            "beta_turn1": [1.0, 0.1, 0.2],
            "beta_turn2": [0.5, 0.6, 0.7],
            "beta_turn3": [0.01, 0.02, 0.03],
            "alpha": [0.0, 1.0, 2.0],
        }
    )


@pytest.mark.parametrize(("step", "index"), [(1, 0), (2, 0), (9, 0), (10, 1), (24, 1), (25, 2), (1000, 2)])
def test_stage_at_switches_at_the_schedule_step(stages, step, index):
    # the original switches at global_step == schedule[i] (global steps are 1-based)
    got_index, _ = adv.stage_at(stages, step)
    assert got_index == index


def test_stage_schedule_zero_three_switches_at_step_three():
    stages = OmegaConf.create(
        {"schedule": [0, 3], "stage_ids": [1, 2], "beta_turn1": [0, 0], "beta_turn2": [0, 0], "beta_turn3": [0, 0]}
        | {"alpha": [0, 0]}
    )
    assert [adv.stage_at(stages, step)[1].stage_id for step in (1, 2, 3, 4)] == [1, 1, 2, 2]


def test_stage_at_returns_that_stage_coefficients(stages):
    assert adv.stage_at(stages, 1) == (0, Stage(stage_id=1, beta_turn1=1.0, beta_turn2=0.5, beta_turn3=0.01, alpha=0.0))
    assert adv.stage_at(stages, 10) == (
        1,
        Stage(stage_id=2, beta_turn1=0.1, beta_turn2=0.6, beta_turn3=0.02, alpha=1.0),
    )
    index, stage = adv.stage_at(stages, 30)
    assert index == 2 and stage.alpha == 2.0 and stage.beta_turn2 == 0.7 and stage.stage_id == 2
    assert isinstance(stage.beta_turn1, float) and isinstance(stage.stage_id, int)


# ---------------------------------------------------------------- advantages

# 6 rows in 2 groups, with different response lengths
SCORES = [1.0, 0.0, 0.0, 2.0, 5.0, -1.0]
INDEX = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
MASK = torch.tensor(
    [
        [1, 1, 1, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 1, 1, 0],
    ]
)


def _token_rewards(scores=SCORES):
    return adv.place_on_last_token(np.array(scores), MASK)


def _per_row(advantages):
    """The single per-row value of an outcome advantage (constant over the row's response tokens)."""
    rows = []
    for row, mask in zip(advantages, MASK, strict=True):
        valid = row[mask.bool()]
        torch.testing.assert_close(valid, torch.full_like(valid, valid[0].item()))
        assert torch.all(row[~mask.bool()] == 0)
        rows.append(valid[0].item())
    return np.array(rows)


def test_grpo_matches_group_normalisation():
    advantages = _advantages("grpo", _token_rewards(), MASK, INDEX, AlgoConfig())
    assert advantages.shape == MASK.shape
    # verl normalises with torch.std (unbiased, n − 1) plus epsilon = 1e-6
    eps = 1e-6
    group_a, group_b = np.array(SCORES[:3]), np.array(SCORES[3:])
    expected = np.concatenate(
        [
            (group_a - group_a.mean()) / (group_a.std(ddof=1) + eps),
            (group_b - group_b.mean()) / (group_b.std(ddof=1) + eps),
        ]
    )
    np.testing.assert_allclose(_per_row(advantages), expected, rtol=1e-5)
    # hand check of group a: mean 1/3, unbiased std 1/√3
    np.testing.assert_allclose(_per_row(advantages)[:3], [2 / np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3)], rtol=1e-5)


def test_grpo_groups_are_independent():
    base = _per_row(_advantages("grpo", _token_rewards(), MASK, INDEX, AlgoConfig()))
    changed_scores = SCORES[:3] + [100.0, -50.0, 7.0]
    changed = _per_row(_advantages("grpo", _token_rewards(changed_scores), MASK, INDEX, AlgoConfig()))
    np.testing.assert_allclose(changed[:3], base[:3], rtol=1e-6)
    assert not np.allclose(changed[3:], base[3:])


def test_grpo_uses_omegaconf_algorithm_config():
    config = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True})
    a = _advantages("grpo", _token_rewards(), MASK, INDEX, config)
    b = _advantages("grpo", _token_rewards(), MASK, INDEX, AlgoConfig())
    torch.testing.assert_close(a, b)


def test_grpo_honours_norm_adv_by_std_in_grpo_false():
    advantages = _advantages("grpo", _token_rewards(), MASK, INDEX, AlgoConfig(norm_adv_by_std_in_grpo=False))
    group_a, group_b = np.array(SCORES[:3]), np.array(SCORES[3:])
    expected = np.concatenate([group_a - group_a.mean(), group_b - group_b.mean()])
    np.testing.assert_allclose(_per_row(advantages), expected, rtol=1e-5)


def test_rloo_leave_one_out_baseline():
    advantages = _advantages("rloo", _token_rewards(), MASK, INDEX, AlgoConfig())
    scores = np.array(SCORES)
    expected = []
    for i in range(len(scores)):
        others = [scores[j] for j in range(len(scores)) if INDEX[j] == INDEX[i] and j != i]
        expected.append(scores[i] - np.mean(others))
    np.testing.assert_allclose(_per_row(advantages), expected, rtol=1e-5)
    # hand check: row 0 = 1 − mean(0, 0) = 1; row 4 = 5 − mean(2, −1) = 4.5
    np.testing.assert_allclose(_per_row(advantages)[[0, 4]], [1.0, 4.5], rtol=1e-6)


def test_reinforce_is_registered_and_broadcasts_the_return():
    # the reward may sit anywhere in the row: the return is the sum over the response
    token_rewards = torch.zeros(MASK.shape)
    token_rewards[0, 0], token_rewards[0, 2] = 0.25, 0.75
    token_rewards[3, 1] = -2.0
    token_rewards[4, 3] = 3.0
    token_rewards[5, 3] = 9.0  # outside row 5's response: ignored
    advantages = _advantages("reinforce", token_rewards, MASK, INDEX, AlgoConfig())
    expected_returns = torch.tensor([1.0, 0.0, 0.0, -2.0, 3.0, 0.0])
    torch.testing.assert_close(advantages, expected_returns[:, None] * MASK.float())


def test_reinforce_has_no_baseline():
    # same scores in a group: GRPO gives 0, REINFORCE keeps the raw return
    scores = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    grpo = _per_row(_advantages("grpo", _token_rewards(scores), MASK, INDEX, AlgoConfig()))
    reinforce = _per_row(_advantages("reinforce", _token_rewards(scores), MASK, INDEX, AlgoConfig()))
    np.testing.assert_allclose(grpo, np.zeros(6), atol=1e-6)
    np.testing.assert_allclose(reinforce, np.full(6, 2.0))


def test_unknown_estimator_raises():
    with pytest.raises(ValueError):
        adv.compute_advantages("no_such_estimator", _token_rewards(), MASK, INDEX, AlgoConfig())


def test_every_accepted_estimator_computes():
    from agent_system import methods

    methods.import_all()  # each method package registers its estimators on import, as the trainer's start-up does
    values = torch.zeros(MASK.shape)
    assert {"archer", "value_baseline", "reinforce", "gae"} <= set(adv.estimator_names())
    for estimator in adv.estimator_names():
        critic_values = values if estimator in adv.VALUE_ESTIMATORS else None
        advantages, returns = adv.compute_advantages(
            estimator, _token_rewards(), MASK, INDEX, AlgoConfig(), critic_values
        )
        assert advantages.shape == MASK.shape and returns.shape == MASK.shape


def test_gae_needs_the_critic_values():
    with pytest.raises(ValueError, match="critic"):
        adv.compute_advantages("gae", _token_rewards(), MASK, INDEX, AlgoConfig())
