"""Bi-level value shaping (agent_system/methods/value_shaping/shaping.py): stop- and full-grad differ where they should
and only there.

* The critic's loss (verl's value loss + the full-grad term) on a real padding-free ``TensorDict`` built the way the
  trainer builds it: same MSE part for both variants; full's gradient w.r.t. V's output = the MSE's gradient plus
  −c·log π_H(g)/N3 at each turn-3 row's V(prompt) position, stop's = the MSE's; c = 0 makes them identical.
* The advantages: the solver's are R − V(prompt) (turn-1 R = the mean R3 of the attempt's refinements); the HL's are
  the same function of (R3, V) for both variants.
* Start-up validation names the keys of contradictory or inert combinations.
"""

import copy
import re
from functools import partial

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig

from agent_system import verl_compat as vc
from agent_system.methods.value_shaping import shaping as vs
from agent_system.multi_turn_rollout.batch import build_rows
from agent_system.trainer import advantages as adv
from agent_system.trainer import critic as critic_module
from agent_system.trainer.advantages import Stage
from agent_system.trainer.config import ConfigError, compose_config, validate_config
from agent_system.trainer.policy import to_padding_free
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
HL_LOG_PROBS = np.array([-3.0, -5.0, -2.0, -7.0])  # log π_H(g) of each feedback (sum over its tokens)
COEF = 0.7
CRITIC = compose_config([]).critic  # what verl's value loss reads: cliprange_value, loss_agg_mode, loss_scale_factor


# ---------------------------------------------------------------- the critic's loss


def _critic_inputs(weights: np.ndarray):
    """A padding-free TensorDict of the six LL rows (values, returns, the full-grad weights) and V's raw output."""
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2], [1, 2, 7, 8], [1, 2, 7, 9, 9, 9]]
    responses = [[5, 6], [7], [8, 9, 10], [11, 12], [13], [14, 15]]
    batch = build_rows(prompts, responses, pad_token_id=0, non_tensors={"turn": LL_ROWS["turn"]})
    mask = batch.batch["response_mask"].float()
    rewards = np.array([0.5, 1.0, 0.0, 1.0, 1.0, 1.0])
    batch.batch["values"] = torch.full(mask.shape, 0.2) * mask
    batch.batch["returns"] = torch.as_tensor(rewards, dtype=torch.float32)[:, None] * mask
    batch.batch[vs.HL_LOG_PROB_WEIGHT] = torch.as_tensor(weights, dtype=torch.float32)
    td = to_padding_free(batch, temperature=1.0)
    vc.tensordict_utils.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    offsets = td["input_ids"].offsets()
    torch.manual_seed(0)
    raw = torch.randn(int(offsets[-1]), requires_grad=True)  # V's output at every token of every row
    return td, raw, offsets, [len(p) for p in prompts]


def _loss_and_grad(value_grad: str, coef: float, weights: np.ndarray):
    td, raw, offsets, prompt_lengths = _critic_inputs(weights)
    values = torch.nested.nested_tensor_from_jagged(raw, offsets)
    loss, metrics = vs.critic_loss(CRITIC, {"values": values}, td, value_coef=coef, value_grad=value_grad)
    loss.backward()
    metrics = {k: v.aggregate() if isinstance(v, vc.Metric) else v for k, v in metrics.items()}
    positions = offsets[:-1] + torch.tensor(prompt_lengths) - 1  # the last prompt token: V(prompt)
    return loss.detach(), metrics, raw.grad.clone(), positions


def _weights():
    return vs.full_grad_weights(np.array(LL_ROWS["turn"]), HL_LOG_PROBS)


def test_full_grad_weights_put_log_pi_h_over_n3_on_turn3_rows_in_hl_order():
    np.testing.assert_allclose(_weights(), [0.0, -3.0 / 4, -5.0 / 4, 0.0, -2.0 / 4, -7.0 / 4])
    with pytest.raises(ValueError, match="3 turn-3 solver rows but 4 feedback rows"):
        vs.full_grad_weights(np.array([1, 3, 3, 3]), HL_LOG_PROBS)


def test_stop_and_full_share_the_mse_part_and_full_adds_minus_c_logp_over_n3_to_the_gradient():
    weights = _weights()
    stop_loss, stop_metrics, stop_grad, positions = _loss_and_grad("stop", COEF, weights)
    full_loss, full_metrics, full_grad, _ = _loss_and_grad("full", COEF, weights)
    assert stop_metrics["critic/vf_loss"] == full_metrics["critic/vf_loss"]  # the same MSE part
    assert stop_metrics[vs.EXTRA_LOSS_METRIC] == 0.0
    assert full_metrics[vs.EXTRA_LOSS_METRIC] != 0.0
    extra = torch.tensor(full_metrics[vs.EXTRA_LOSS_METRIC], dtype=torch.float32)
    torch.testing.assert_close(full_loss - stop_loss, extra)
    expected = stop_grad.clone()
    expected[positions] += torch.as_tensor(-COEF * weights, dtype=torch.float32)  # −c·log π_H(g)/N3 at V(x, z, g)
    torch.testing.assert_close(full_grad, expected)
    diff = (full_grad - stop_grad).nonzero().flatten()
    turn3_positions = positions[np.array(LL_ROWS["turn"]) == 3]
    assert sorted(diff.tolist()) == sorted(turn3_positions.tolist())  # only V(x, z, g) of turn-3 rows differs
    assert stop_grad.abs().sum() > 0  # the MSE's own gradient is there in both


def test_zero_coefficient_makes_the_variants_identical():
    weights = _weights()
    stop_loss, _, stop_grad, _ = _loss_and_grad("stop", 0.0, weights)
    full_loss, metrics, full_grad, _ = _loss_and_grad("full", 0.0, weights)
    assert metrics[vs.EXTRA_LOSS_METRIC] == 0.0
    torch.testing.assert_close(full_loss, stop_loss)
    torch.testing.assert_close(full_grad, stop_grad)


def test_stop_equals_verls_value_loss():
    td, raw, offsets, _ = _critic_inputs(_weights())
    values = torch.nested.nested_tensor_from_jagged(raw, offsets)
    stop, _ = vs.critic_loss(CRITIC, {"values": values}, td, value_coef=COEF, value_grad="stop")
    verl_loss, _ = partial(vc.value_loss, config=CRITIC)(model_output={"values": values}, data=td)
    torch.testing.assert_close(stop, verl_loss)


# ---------------------------------------------------------------- the term per optimizer step (issue 16, item 4)


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
    log_probs = -rng.uniform(1.0, 20.0, size=int((turn == 3).sum()))  # log π_H(g) of each feedback
    batch.batch[vs.HL_LOG_PROB_WEIGHT] = torch.as_tensor(vs.full_grad_weights(turn, log_probs), dtype=torch.float32)
    row_log_prob = np.zeros(count)
    row_log_prob[turn == 3] = log_probs
    batch.batch["row_log_prob"] = torch.as_tensor(row_log_prob, dtype=torch.float64)  # to check each step against
    return batch, log_probs


def _step_terms(shuffle: bool, mini_batch: int = 128, epochs: int = 1):
    """The full-grad term of each optimizer step of one critic update, as the critic's loss computes it on the
    mini-batches verl's iterator cuts (``TrainingWorker.train_mini_batch``), with, per step, the sum of
    log π_H(g)·V(x, z, g) over its turn-3 rows and their number."""
    batch, log_probs = _many_rows()
    config = copy.deepcopy(CRITIC)
    config.ppo_mini_batch_size, config.shuffle, config.ppo_epochs = mini_batch, shuffle, epochs
    td, _ = critic_module.update_data(batch, config, world_size=1, temperature=1.0)
    tu = vc.tensordict_utils
    size = tu.pop(td, key="mini_batch_size")
    loader = {k: tu.pop(td, key=k) for k in ("epochs", "seed", "dataloader_kwargs")}
    assert size == mini_batch and loader["epochs"] == epochs
    steps, sums, counts = [], [], []
    torch.manual_seed(0)
    for part in tu.make_iterator(td, mini_batch_size=size, **loader):
        tu.assign_non_tensor(part, dp_size=1, batch_num_tokens=None)
        offsets = part["input_ids"].offsets()
        values = torch.nested.nested_tensor_from_jagged(torch.randn(int(offsets[-1])), offsets)
        _, metrics = vs.critic_loss(config, {"values": values}, part, value_coef=COEF, value_grad="full")
        steps.append(metrics[vs.EXTRA_LOSS_METRIC].aggregate())
        v_prompt = vc.no_padding_2_padding(values, part)[:, 0].double()
        turn3 = np.array(list(part["turn"])) == 3
        sums.append((part["row_log_prob"] * v_prompt).numpy()[turn3].sum())
        counts.append(int(turn3.sum()))
    return np.array(steps), np.array(sums), np.array(counts), len(log_probs)


def test_each_critic_step_gets_minus_c_mean_over_its_turn3_rows():
    # issue 16, item 4: 256 rows in mini-batches of 128 gave each step half of the −c·mean term
    steps, sums, counts, n3 = _step_terms(shuffle=False)
    assert n3 == 192 and counts.tolist() == [96, 96]  # two optimizer steps, each with its share of turn-3 rows
    expected = -COEF * sums / counts  # −c·mean over the step's turn-3 rows of log π_H(g)·V(x, z, g)
    np.testing.assert_allclose(steps, expected, rtol=1e-5)
    assert np.abs(expected).min() > 0.1  # a term the comparison can see


def test_shuffled_mini_batches_each_estimate_the_whole_batch_mean():
    # like the MSE's mini-batch mean: (k / N3)·Σ over the step's turn-3 rows, k = 256 / 64 steps per epoch
    steps, sums, counts, n3 = _step_terms(shuffle=True, mini_batch=64, epochs=2)
    assert len(steps) == 8 and counts.sum() == 2 * n3 and len(set(counts.tolist())) > 1  # uneven shares
    np.testing.assert_allclose(steps, -COEF * 4 * sums / n3, rtol=1e-5, atol=1e-5)


def test_step_weights_need_whole_mini_batches():
    with pytest.raises(ValueError, match="256 critic rows do not split into mini-batches of 100"):
        vs.step_weights(torch.zeros(256), 256, 100)


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
    return compose_config(VALID + ["mlmt.value_shaping.value_grad=full"])


def _broken(config, **changes):
    config = copy.deepcopy(config)
    for key, value in changes.items():
        OmegaConf.update(config, key, value, merge=False)
    return config


def test_the_recipes_configs_are_valid(shaped_config):
    validate_config(shaped_config)
    validate_config(_broken(shaped_config, **{"mlmt.value_shaping.value_grad": "stop"}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mlmt.value_shaping.value_grad": "sideways"}, "mlmt.value_shaping.value_grad='sideways'"),
        ({"mlmt.feedback": "self"}, "needs mlmt.feedback=model"),
        ({"mlmt.ll.adv_estimator": "grpo"}, "set mlmt.ll.adv_estimator=value_baseline"),
        ({"mlmt.value_shaping.value_coef": 0.0}, "mlmt.value_shaping.value_coef=0"),
        ({"mlmt.hl.freeze": True}, "mlmt.hl.freeze=true"),
        ({"mlmt.ll.freeze": True}, "mlmt.ll.freeze=true"),
        ({"mlmt.schedule.tL": 3}, "mlmt.schedule.tH=1, mlmt.schedule.tL=1"),
        ({"mlmt.stages.stage_ids": [1]}, "mlmt.stages.stage_ids=1"),
        ({"mlmt.hl.adv_estimator": "value_baseline"}, "the solver's (mlmt.ll) only"),
        ({"mlmt.reward.hl_reward": "r3"}, "value_grad=full acts only with mlmt.reward.hl_reward=value_shaped"),
    ],
)
def test_contradictory_or_inert_combinations_are_rejected_by_name(shaped_config, changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(_broken(shaped_config, **changes))


def test_symmetric_reward_alone_is_inert():
    config = compose_config(["mlmt.value_shaping.symmetric_reward=true"])
    with pytest.raises(ConfigError, match="symmetric_reward=true acts only with"):
        validate_config(config)
    with pytest.raises(ConfigError, match="mlmt.feedback=none has none"):
        validate_config(compose_config(["mlmt.feedback=none", "mlmt.ll.adv_estimator=value_baseline", "mlmt.n=2"]))
