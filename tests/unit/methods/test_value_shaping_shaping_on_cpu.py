"""Bi-level value shaping (agent_system/methods/value_shaping/shaping.py): stop- and full-grad differ where they should
and only there, and the full-grad term stays on the value loss's scale.

* The critic's loss (verl's value loss + the full-grad term) on a real padding-free ``TensorDict`` built the way the
  trainer builds it: same MSE part for both variants; full's gradient w.r.t. V's output = the MSE's gradient plus
  −c·w at each turn-3 row's V(prompt) position, weighted as the MSE weighs that token (w: the feedback's centred
  mean token log-prob); stop's = the MSE's; c = 0 makes them identical. Against the MSE's gradient per unit of
  error, the term is at most c·(the range of token log-probs) for feedbacks of any length (issue 34, item 8).
* The advantages: the solver's are R − V(prompt) (turn-1 R = the mean R3 of the attempt's refinements); the HL's are
  the same function of (R3, V) for both variants.
* Start-up validation names the keys of contradictory or inert combinations."""

import copy
import re
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from config_copies import copier
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig

from agent_system import verl_compat as vc
from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.levels import critic as critic_module
from agent_system.levels.policy import to_padding_free
from agent_system.methods.value_shaping import shaping as vs
from agent_system.trainer import advantages as adv
from agent_system.trainer.advantages import Stage
from agent_system.trainer.packing import build_rows
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores

# one problem, n = 2 attempts, m = 2 feedbacks each: LL rows (turn 1, turn 3) and HL rows (turn 2)
LL_ROWS = {
    "problem": [0, 0, 0, 0, 0, 0],
    "attempt": [0, 0, 0, 1, 1, 1],
    "feedback": [0, 0, 1, 0, 0, 1],
    "turn": [1, 3, 3, 1, 3, 3],
}
HL_ROWS = {"problem": [0, 0, 0, 0], "attempt": [0, 0, 1, 1], "feedback": [0, 1, 0, 1], "turn": [2, 2, 2, 2]}
SCORES = StepScores(r1=np.array([[0.0, 1.0]]), r3=np.array([[[1.0, 0.0], [1.0, 1.0]]]))
STAGE = Stage(stage_id=2, beta_turn1=0.0, beta_turn2=0.0, beta_turn3=0.0, alpha=0.0)
HL_MEAN_LOG_PROBS = np.array([-0.5, -2.0, -1.0, -3.0])  # mean token log-prob of each feedback under π_H
COEF = 0.7
CRITIC = compose_config([]).critic  # what verl's value loss reads: cliprange_value, loss_agg_mode, loss_scale_factor


# ---------------------------------------------------------------- the critic's loss


def _critic_inputs(weights: np.ndarray, raw_values=None):
    """A padding-free TensorDict of the six LL rows (values, returns, the full-grad weights) and V's raw output
    (random, or ``raw_values`` at every token)."""
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2], [1, 2, 7, 8], [1, 2, 7, 9, 9, 9]]
    responses = [[5, 6], [7], [8, 9, 10], [11, 12], [13], [14, 15]]
    batch = build_rows(prompts, responses, pad_token_id=0, non_tensors={"turn": LL_ROWS["turn"]})
    mask = batch.batch["response_mask"].float()
    batch.batch["values"] = torch.full(mask.shape, 0.2) * mask
    batch.batch["returns"] = torch.as_tensor(RETURNS, dtype=torch.float32)[:, None] * mask
    batch.batch[vs.HL_LOG_PROB_WEIGHT] = torch.as_tensor(weights, dtype=torch.float32)
    td = to_padding_free(batch, temperature=1.0)
    vc.tensordict_utils.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    offsets = td["input_ids"].offsets()
    torch.manual_seed(0)
    raw = torch.randn(int(offsets[-1])) if raw_values is None else torch.full((int(offsets[-1]),), raw_values)
    raw.requires_grad_(True)  # V's output at every token of every row
    return td, raw, offsets, [len(p) for p in prompts], int(mask.sum())


RETURNS = np.array([0.5, 1.0, 0.0, 1.0, 1.0, 1.0])


def _loss_and_grad(value_grad: str, coef: float, weights: np.ndarray, raw_values=None):
    td, raw, offsets, prompt_lengths, tokens = _critic_inputs(weights, raw_values)
    values = torch.nested.nested_tensor_from_jagged(raw, offsets)
    loss, metrics = vs.critic_loss(CRITIC, {"values": values}, td, value_coef=coef, value_grad=value_grad)
    loss.backward()
    metrics = {k: v.aggregate() if isinstance(v, vc.Metric) else v for k, v in metrics.items()}
    positions = offsets[:-1] + torch.tensor(prompt_lengths) - 1  # the last prompt token: V(prompt)
    return loss.detach(), metrics, raw.grad.clone(), positions, tokens


def _weights():
    return vs.full_grad_weights(np.array(LL_ROWS["turn"]), HL_MEAN_LOG_PROBS)


def test_full_grad_weights_are_the_centred_mean_log_probs_on_turn3_rows_in_hl_order():
    # mean of HL_MEAN_LOG_PROBS: −1.625
    np.testing.assert_allclose(_weights(), [0.0, 1.125, -0.375, 0.0, 0.625, -1.375])
    with pytest.raises(ValueError, match="3 turn-3 solver rows but 4 feedback rows"):
        vs.full_grad_weights(np.array([1, 3, 3, 3]), HL_MEAN_LOG_PROBS)


def test_stop_and_full_share_the_mse_part_and_full_adds_minus_c_w_at_the_mse_token_weight():
    weights = _weights()
    stop_loss, stop_metrics, stop_grad, positions, tokens = _loss_and_grad("stop", COEF, weights)
    full_loss, full_metrics, full_grad, _, _ = _loss_and_grad("full", COEF, weights)
    assert stop_metrics["critic/vf_loss"] == full_metrics["critic/vf_loss"]  # the same MSE part
    assert stop_metrics[vs.EXTRA_LOSS_METRIC] == 0.0
    assert full_metrics[vs.EXTRA_LOSS_METRIC] != 0.0
    extra = torch.tensor(full_metrics[vs.EXTRA_LOSS_METRIC], dtype=torch.float32)
    torch.testing.assert_close(full_loss - stop_loss, extra)
    expected = stop_grad.clone()
    # −c·w at V(x, z, g), weighted 1/(response tokens) as verl's token-mean MSE weighs each token
    expected[positions] += torch.as_tensor(-COEF * weights / tokens, dtype=torch.float32)
    torch.testing.assert_close(full_grad, expected)
    diff = (full_grad - stop_grad).nonzero().flatten()
    turn3_positions = positions[np.array(LL_ROWS["turn"]) == 3]
    assert sorted(diff.tolist()) == sorted(turn3_positions.tolist())  # only V(x, z, g) of turn-3 rows differs
    assert stop_grad.abs().sum() > 0  # the MSE's own gradient is there in both


def _hl_batch(lengths: list[int], seed: int = 0):
    """The HL rows' pre-update log-probs: feedbacks of the given lengths, token log-probs uniform in [−3, 0]."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    mask = torch.as_tensor(np.arange(width)[None, :] < np.array(lengths)[:, None], dtype=torch.long)
    log_probs = torch.as_tensor(-rng.uniform(0.0, 3.0, size=(len(lengths), width)), dtype=torch.float32)
    return SimpleNamespace(batch={"old_log_probs": log_probs * mask, "response_mask": mask})


@pytest.mark.parametrize("length", [4, 64, 1024])
def test_full_grad_term_stays_within_c_times_the_log_prob_range_of_the_value_loss_whatever_the_feedback_length(length):
    # issue 34, item 8: at each V(x, z, g) the term's gradient over the MSE's per unit of error (V − R) is c·|w|;
    # with token log-probs in [−3, 0] that is at most 3c for feedbacks of any length. The summed log-prob (the old
    # weight) gave c·|Σ log π|·(tokens/N3): ×100 at 4 tokens, growing with the length.
    ll_batch = SimpleNamespace(non_tensor_batch={"turn": np.array(LL_ROWS["turn"])})
    hl_batch = _hl_batch([length, length // 2, length, length // 4])
    weights = vs.critic_weights(ll_batch, hl_batch).numpy()
    _, _, stop_grad, positions, _ = _loss_and_grad("stop", COEF, weights, raw_values=0.2)  # no clipping: V = old V
    _, _, full_grad, _, _ = _loss_and_grad("full", COEF, weights, raw_values=0.2)
    turn3 = np.array(LL_ROWS["turn"]) == 3
    mse_per_unit_error = (stop_grad[positions] / torch.as_tensor(0.2 - RETURNS, dtype=torch.float32))[turn3]
    term = (full_grad - stop_grad)[positions][turn3]
    ratio = (term.abs() / mse_per_unit_error.abs()).numpy()
    assert ratio.max() <= 3 * COEF, ratio
    assert ratio.max() > 0.01 * COEF  # a term the comparison can see
    assert abs(float(term.sum())) < 1e-6  # centred: no net push on V's level


def test_zero_coefficient_makes_the_variants_identical():
    weights = _weights()
    stop_loss, _, stop_grad, _, _ = _loss_and_grad("stop", 0.0, weights)
    full_loss, metrics, full_grad, _, _ = _loss_and_grad("full", 0.0, weights)
    assert metrics[vs.EXTRA_LOSS_METRIC] == 0.0
    torch.testing.assert_close(full_loss, stop_loss)
    torch.testing.assert_close(full_grad, stop_grad)


def test_stop_equals_verls_value_loss():
    td, raw, offsets, _, _ = _critic_inputs(_weights())
    values = torch.nested.nested_tensor_from_jagged(raw, offsets)
    stop, _ = vs.critic_loss(CRITIC, {"values": values}, td, value_coef=COEF, value_grad="stop")
    verl_loss, _ = partial(vc.value_loss, config=CRITIC)(model_output={"values": values}, data=td)
    torch.testing.assert_close(stop, verl_loss)


# ---------------------------------------------------------------- the term per optimizer step


def _many_rows(problems=32, n=2, m=3):
    """LL rows in the trainer's order (per attempt: its turn-1 row, then its m turn-3 rows) and their full-grad
    weights: 32 problems × 2 attempts × (1 + 3) = 256 rows, 192 of them turn-3."""
    turn = np.array(([1] + [3] * m) * (problems * n))
    count = len(turn)
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(2, 50, size=int(rng.integers(1, 5))).tolist() for _ in range(count)]
    responses = [rng.integers(2, 50, size=int(rng.integers(1, 4))).tolist() for _ in range(count)]
    batch = build_rows(prompts, responses, pad_token_id=0, non_tensors={"turn": turn.tolist()})
    mask = batch.batch["response_mask"].float()
    batch.batch["values"] = torch.full(mask.shape, 0.2) * mask
    batch.batch["returns"] = torch.as_tensor(rng.integers(0, 2, size=count), dtype=torch.float32)[:, None] * mask
    mean_log_probs = -rng.uniform(0.1, 3.0, size=int((turn == 3).sum()))  # of each feedback
    weights = vs.full_grad_weights(turn, mean_log_probs)
    batch.batch[vs.HL_LOG_PROB_WEIGHT] = torch.as_tensor(weights, dtype=torch.float32)
    batch.batch["row_weight"] = torch.as_tensor(weights, dtype=torch.float64)  # to check each step against
    return batch


def _step_terms(shuffle: bool, mini_batch: int = 128, epochs: int = 1):
    """The full-grad term of each optimizer step of one critic update, as the critic's loss computes it on the
    mini-batches verl's iterator cuts (``TrainingWorker.train_mini_batch``), with, per step, the sum of
    w·V(x, z, g) over its rows and its number of response tokens."""
    config = copy.deepcopy(CRITIC)
    config.ppo_mini_batch_size, config.shuffle, config.ppo_epochs = mini_batch, shuffle, epochs
    td, _ = critic_module.update_data(_many_rows(), config, world_size=1, temperature=1.0)
    tu = vc.tensordict_utils
    size = tu.pop(td, key="mini_batch_size")
    loader = {k: tu.pop(td, key=k) for k in ("epochs", "seed", "dataloader_kwargs")}
    assert size == mini_batch and loader["epochs"] == epochs
    steps, sums, tokens = [], [], []
    torch.manual_seed(0)
    for part in tu.make_iterator(td, mini_batch_size=size, **loader):
        tu.assign_non_tensor(part, dp_size=1, batch_num_tokens=None)
        offsets = part["input_ids"].offsets()
        values = torch.nested.nested_tensor_from_jagged(torch.randn(int(offsets[-1])), offsets)
        _, metrics = vs.critic_loss(config, {"values": values}, part, value_coef=COEF, value_grad="full")
        steps.append(metrics[vs.EXTRA_LOSS_METRIC].aggregate())
        v_prompt = vc.no_padding_2_padding(values, part)[:, 0].double()
        sums.append(float((part["row_weight"] * v_prompt).sum()))
        tokens.append(int(part.select("response_mask").to_padded_tensor()["response_mask"].sum()))
    return np.array(steps), np.array(sums), np.array(tokens)


@pytest.mark.parametrize(("shuffle", "mini_batch", "epochs"), [(False, 128, 1), (True, 64, 2)])
def test_each_critic_step_weighs_the_term_like_its_own_mse(shuffle, mini_batch, epochs):
    # each step: −c·Σ w·V(x, z, g) over the response tokens of its own mini-batch, the normaliser of its MSE
    steps, sums, tokens = _step_terms(shuffle, mini_batch, epochs)
    assert len(steps) == epochs * 256 // mini_batch
    np.testing.assert_allclose(steps, -COEF * sums / tokens, rtol=1e-5, atol=1e-6)
    assert np.abs(steps).max() > 1e-3  # a term the comparison can see


# ---------------------------------------------------------------- advantages


def _mlmt(value_grad="stop", symmetric=False, hl="reinforce"):
    return OmegaConf.create(
        {
            "ll": {"adv_estimator": "value_baseline", "turn3_group_by": "problem"},
            "hl": {"adv_estimator": hl},
            "reward": {"hl_reward": "value_shaped", "contrastive_lambda": 0.5},
            "value_shaping": {"value_coef": COEF, "value_grad": value_grad, "symmetric_reward": symmetric},
            "stages": {"kl_in": "loss"},
        }
    )


def _level(level, mlmt, mask, **inputs):
    """level_advantages' arguments for the LL or HL rows above."""
    rows = RowKeys(**(LL_ROWS if level == "ll" else HL_ROWS))
    return {
        "level": level, "rows": rows, "scores": SCORES, "stage": STAGE, "mlmt": mlmt, "algorithm": AlgoConfig(),
        "inputs": LevelInputs(kl=np.zeros(len(rows)), response_mask=mask, **inputs),
    }  # fmt: skip


def _mask(count):
    mask = torch.ones(count, 4, dtype=torch.long)
    mask[::2, 2:] = 0
    return mask


def test_solver_advantages_are_r_minus_v_of_the_prompt():
    mask = _mask(6)
    values = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 30  # V(prompt) = column 0
    result = adv.level_advantages(**_level("ll", _mlmt(), mask, values=values))
    # turn 1: mean R3 of the attempt's refinements (0.5, 1.0); turn 3: the refinement's R3
    rewards = np.array([0.5, 1.0, 0.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(result.task_rewards, rewards)
    expected = (torch.as_tensor(rewards, dtype=torch.float32) - values[:, 0])[:, None] * mask
    torch.testing.assert_close(result.advantages, expected)
    torch.testing.assert_close(result.returns, torch.as_tensor(rewards, dtype=torch.float32)[:, None] * mask)
    symmetric = adv.level_advantages(**_level("ll", _mlmt(symmetric=True), mask, values=values))
    np.testing.assert_allclose(symmetric.task_rewards, 2 * rewards - 1)


@pytest.mark.parametrize("hl", ["reinforce", "grpo"])
def test_hl_advantages_are_the_same_function_of_r_and_v_for_both_variants(hl):
    mask, v = _mask(4), np.array([0.3, -0.1, 0.8, 0.2])
    results = {
        grad: adv.level_advantages(**_level("hl", _mlmt(grad, hl=hl), mask, features={"feedback_values": v}))
        for grad in vs.VALUE_GRADS
    }
    torch.testing.assert_close(results["stop"].advantages, results["full"].advantages)
    shaped = np.array([1.0, 0.0, 1.0, 1.0]) + COEF * v
    np.testing.assert_allclose(results["stop"].task_rewards, shaped)
    if hl == "reinforce":
        torch.testing.assert_close(
            results["stop"].advantages, torch.as_tensor(shaped, dtype=torch.float32)[:, None] * mask
        )
    assert not torch.equal(results["stop"].advantages, results["stop"].r3_advantages)  # V moves them


# ---------------------------------------------------------------- start-up validation

VALID = [
    "mlmt.ll.adv_estimator=value_baseline",
    "mlmt.reward.hl_reward=value_shaped",
    "mlmt.hl.adv_estimator=reinforce",
]


@pytest.fixture(scope="module")
def shaped_config():
    """A function returning a fresh copy of the recipe's config."""
    return copier(compose_config(VALID + ["mlmt.value_shaping.value_grad=full"]))


def _broken(copy_of, **changes):
    config = copy_of()
    for key, value in changes.items():
        OmegaConf.update(config, key, value, merge=False)
    return config


def test_the_recipes_configs_are_valid(shaped_config):
    check_config(shaped_config())
    check_config(_broken(shaped_config, **{"mlmt.value_shaping.value_grad": "stop"}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mlmt.value_shaping.value_grad": "sideways"}, "mlmt.value_shaping.value_grad='sideways'"),
        # the core's check (config.validate_config) runs before the method's ("needs mlmt.feedback=model")
        ({"mlmt.feedback": "self"}, "mlmt.feedback=self has no feedback writer (HL), so ['mlmt.reward.hl_reward']"),
        ({"mlmt.ll.adv_estimator": "grpo"}, "set mlmt.ll.adv_estimator=value_baseline"),
        ({"mlmt.value_shaping.value_coef": 0.0}, "mlmt.value_shaping.value_coef=0"),
        ({"mlmt.hl.freeze": True}, "mlmt.hl.freeze=true"),
        ({"mlmt.ll.freeze": True}, "mlmt.ll.freeze=true"),
        ({"mlmt.schedule.tL": 3}, "mlmt.schedule.tH=1, mlmt.schedule.tL=1"),
        (
            {"data.train_batch_size": 1, "mlmt.n": 1, "mlmt.m": 1},
            "value_grad=full with one feedback per step (data.train_batch_size=1, mlmt.n=1, mlmt.m=1)",
        ),
        ({"mlmt.stages.stage_ids": [1]}, "mlmt.stages.stage_ids=1"),
        ({"mlmt.hl.adv_estimator": "value_baseline"}, "the solver's (mlmt.ll) only"),
        ({"mlmt.reward.hl_reward": "r3"}, "value_grad=full acts only with mlmt.reward.hl_reward=value_shaped"),
    ],
)
def test_contradictory_or_inert_combinations_are_rejected_by_name(shaped_config, changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(_broken(shaped_config, **changes))


def test_symmetric_reward_alone_is_inert():
    config = compose_config(["mlmt.value_shaping.symmetric_reward=true"])
    with pytest.raises(ConfigError, match="symmetric_reward=true acts only with"):
        check_config(config)
    with pytest.raises(ConfigError, match="mlmt.feedback=none has none"):
        check_config(compose_config(["mlmt.feedback=none", "mlmt.ll.adv_estimator=value_baseline", "mlmt.n=2"]))
