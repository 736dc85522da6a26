"""The ``hf`` rollout server generates on its worker's device (issue 43, item 4): on the GPUs Ray gave the actor worker
it serves (``cuda_visible_devices``, as verl's vLLM server gets them), on the CPU where the worker has none. One code
path: the CPU case is checked here for parity of outputs (greedy tokens and their log-probs equal those of
``transformers``' own ``generate`` and a teacher-forced forward pass), the CUDA case's choices as values."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agent_system.cpu_backend.hf_rollout import server_options
from agent_system.cpu_backend.hf_server import HFRolloutServer, server_device


def test_a_worker_without_gpus_gets_a_cpu_server_in_rays_default_environment():
    assert server_device("") == torch.device("cpu")
    assert server_options([]) == ({}, {})  # as before: no runtime env, no device argument


@pytest.mark.parametrize(("gpu_ids", "visible"), [(["3"], "3"), (["0", "1"], "0,1")])
def test_a_worker_with_gpus_gets_a_server_on_them(gpu_ids, visible):
    options, args = server_options(gpu_ids)
    assert args == {"cuda_visible_devices": visible}
    # Ray would clear CUDA_VISIBLE_DEVICES in an actor that asks for no GPU: the server keeps it and sets it itself
    assert options == {"runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}
    assert server_device(visible) == torch.device("cuda", 0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from agent_system.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("hf_device") / "model")


def test_greedy_tokens_and_log_probs_on_cpu_equal_transformers_own(tiny):
    from transformers import AutoModelForCausalLM

    server = HFRolloutServer(tiny, "float32", eos_token_ids=[0], pad_token_id=0, max_model_len=64, default_max_tokens=6)
    assert server.device == torch.device("cpu") and {p.device.type for p in server.model.parameters()} == {"cpu"}
    prompts = [[5, 17, 42, 99], [7, 8]]

    async def generate_all():
        calls = [server.generate(p, {"temperature": 0.0, "max_tokens": 6}, f"r{i}") for i, p in enumerate(prompts)]
        return await asyncio.gather(*calls)

    outputs = asyncio.run(generate_all())
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa").eval()
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            expected = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=[0], pad_token_id=0)
            tokens = expected[0, len(prompt) :].tolist()
            end = next((i + 1 for i, t in enumerate(tokens) if t == 0), len(tokens))
            full = torch.tensor([prompt + tokens[:end]])
            log_probs = torch.log_softmax(model(full).logits.float(), dim=-1)[0, len(prompt) - 1 : -1]
        assert output.token_ids == tokens[:end]
        wanted = log_probs.gather(1, torch.tensor(tokens[:end]).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(output.log_probs), wanted, atol=1e-4)


def test_weights_pushed_after_a_level_2_sleep_take_the_servers_device_and_dtype(tiny):
    """After a sleep that freed the weights, the push is assigned as it comes: it must land where and as the server
    generates (a bfloat16 server fed the actor's float32 state stays bfloat16; on a GPU, on the GPU)."""
    server = HFRolloutServer(tiny, "bfloat16", [0], 0, 64, 4, free_weights_on_sleep=True)
    state = {name: tensor.float().clone() for name, tensor in server.model.state_dict().items()}

    async def sleep_then_push():
        await server.sleep()
        assert server.weights_freed
        await server.update_weights(state, global_steps=1)
        return await server.generate([5, 6, 7], {"temperature": 0.0, "max_tokens": 3}, "after")

    output = asyncio.run(sleep_then_push())
    assert {(p.device.type, p.dtype) for p in server.model.parameters()} == {("cpu", torch.bfloat16)}
    assert len(output.token_ids) >= 1 and not server.asleep
