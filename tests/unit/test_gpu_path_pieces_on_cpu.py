"""Pure pieces of the GPU-shaped path (no Ray): DP padding and mini-batch sizes, truncation from the token budget,
the pad-token fallback, per-level replica ranks, the vLLM-CPU weight-keeping plugin, the console noise filter."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch


def _rows(count: int):
    from agent_system.trainer.packing import build_rows

    rows = build_rows([[1, 2, 3]] * count, [[4, 5]] * count, 0)
    rows.batch["advantages"] = torch.ones(count, 2)
    return rows


def test_pad_to_multiple_adds_masked_rows_only():
    from agent_system.levels.policy import pad_to_multiple

    rows = _rows(5)
    padded, pad = pad_to_multiple(rows, 2)
    assert (len(padded), pad) == (6, 1)
    assert padded.batch["response_mask"][-1].sum() == 0 and padded.batch["advantages"][-1].abs().sum() == 0
    assert padded.batch["attention_mask"][-1].sum() > 0  # still a valid sequence for the padding-free conversion
    assert rows.batch["response_mask"].sum() == 10 and rows.batch["advantages"].sum() == 10  # input untouched
    same, none = pad_to_multiple(_rows(4), 2)
    assert (len(same), none) == (4, 0)


@pytest.mark.parametrize(
    ("total", "limit", "world", "expected"),
    [(6, 4, 2, 2), (12, 16, 2, 12), (8, 16, 4, 8), (12, 8, 2, 6), (2, 16, 2, 2), (4, 1, 2, 2)],
)
def test_mini_batch_size_is_a_dp_multiple_dividing_the_batch(total, limit, world, expected):
    from agent_system.levels.policy import mini_batch_size

    size = mini_batch_size(total, limit, world)
    assert size == expected and size % world == 0 and (total // world) % (size // world) == 0


def test_mini_batch_size_rejects_an_unpadded_batch():
    from agent_system.levels.policy import mini_batch_size

    with pytest.raises(ValueError, match="data-parallel"):
        mini_batch_size(5, 4, 2)


def test_truncation_is_read_from_the_token_budget():
    from agent_system.multi_turn_rollout.episode import is_truncated

    assert is_truncated([1, 2, 3], 3, {9})
    assert not is_truncated([1, 2, 9], 3, {9})  # stopped exactly at the budget
    assert not is_truncated([1, 9], 3, {9})


def test_padding_id_falls_back_to_eos_for_padless_tokenizers(tmp_path):
    from transformers import AutoTokenizer

    from agent_system.models.tiny import build_tiny_tokenizer
    from agent_system.trainer.packing import build_rows, padding_id

    build_tiny_tokenizer(tmp_path, pad_token=False)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.pad_token_id is None
    assert padding_id(tokenizer) == tokenizer.eos_token_id
    rows = build_rows([[5, 6], [7]], [[8], [9, 10]], padding_id(tokenizer))  # TypeError with None before
    assert rows.batch["attention_mask"].sum() == 6


@pytest.mark.parametrize(
    ("overrides", "offset"),
    [
        (["mlmt.ll_gpus=2", "mlmt.hl_gpus=2"], 2),
        (["mlmt.placement=colocated", "trainer.n_gpus_per_node=4"], 4),
        ([], 1),
    ],
)
def test_hl_replica_ranks_start_after_the_ll_replicas(overrides, offset):
    from agent_system.config import compose_config
    from agent_system.levels.level_rollout import replica_rank_offset
    from agent_system.levels.placement import assign_replica_ranks

    config = compose_config(overrides)
    assign_replica_ranks(config)
    assert replica_rank_offset(config.actor_rollout_ref.rollout) == 0
    assert replica_rank_offset(config.hl.rollout) == offset


def test_vllm_cpu_plugin_keeps_linear_weights_for_weight_sync():
    from vllm.model_executor.layers import utils

    from agent_system.cpu_backend.vllm_plugin import register

    register()
    layer = torch.nn.Linear(64, 64, bias=False)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight.numel() == 64 * 64  # vLLM-CPU would leave an empty parameter: weight sync cannot load it
    assert getattr(layer, "cpu_linear", None) is not None


def test_console_filter_drops_known_noise_only(caplog):
    from agent_system import log_filter

    def record(name: str, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, "", 0, message, None, None)

    noise = record("vllm.v1.worker", "libiomp is not found in LD_PRELOAD")
    real = record("vllm.v1.worker", "KV cache is too small")
    other = record("agent_system", "libiomp is not found in LD_PRELOAD")
    keep = log_filter.KnownNoiseFilter()
    assert not keep.filter(noise) and keep.filter(real) and keep.filter(other)
    log_filter.install()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        log_filter.install()
        warnings.warn("torchtitan engine is not available: ModuleNotFoundError", UserWarning, stacklevel=1)
        warnings.warn("a real problem", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["a real problem"]


def test_project_info_logs_survive_vllms_logging_dependency(monkeypatch):
    """vLLM's dependency model_hosting_container_standards raises the root logger (and its handlers) to ERROR on import,
    which hid "checkpoint saved", "resumed from" and the run summary."""
    from model_hosting_container_standards.logging_config import configure_root_logger

    from agent_system import log_filter

    monkeypatch.delenv("SAGEMAKER_CONTAINER_LOG_LEVEL", raising=False)
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.INFO)
    log_filter.keep_root_log_level()
    configure_root_logger()
    assert root.level == logging.INFO


def test_rollout_backends_without_per_level_ranks_are_rejected():
    from agent_system.config import ConfigError, compose_config
    from agent_system.launcher.main import check_config

    config = compose_config(["hl.rollout.name=sglang"])
    with pytest.raises(ConfigError, match=r"hl\.rollout\.name='sglang'"):
        check_config(config)


def test_turns_from_vllm_outputs_count_truncation_without_a_finish_reason(tmp_path):
    """The episode and the lagged snapshot build turns with one helper; vLLM's TokenOutput has no finish_reason."""
    from transformers import AutoTokenizer

    from agent_system import verl_compat as vc
    from agent_system.models.tiny import build_tiny_tokenizer
    from agent_system.multi_turn_rollout.episode import turn_from_output

    build_tiny_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    eos = tokenizer.eos_token_id
    cut = vc.TokenOutput(token_ids=[5, 6, 7], log_probs=[-0.1, -0.2, -0.3], stop_reason="completed")
    done = vc.TokenOutput(token_ids=[5, 6, eos], log_probs=[-0.1, -0.2, -0.3], stop_reason="completed")
    turn = turn_from_output([1, 2], cut, tokenizer, 3, {eos})
    assert turn.truncated and turn.response_ids == [5, 6, 7] and turn.log_probs == [-0.1, -0.2, -0.3]
    assert not turn_from_output([1, 2], done, tokenizer, 3, {eos}).truncated
