"""The ``hf`` rollout server samples each request from its own generator: a request with a seed gets the same tokens
whichever requests share its batch (the server batches requests as they arrive, so without this a run's samples
changed from run to run), different seeds give different samples, top-k acts before the draw, and the log-probs it
returns are those of the sampled tokens under ``softmax(logits / T)``."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agent_system.cpu_backend.hf_server import HFRolloutServer

PROMPTS = [[5, 17, 42, 99], [7, 8], [11, 12, 13, 14, 15, 16, 17], [3]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from agent_system.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("hf_sampling") / "model")


def _server(tiny: str, seed: int = 0) -> HFRolloutServer:
    return HFRolloutServer(tiny, "float32", [0], 0, max_model_len=64, default_max_tokens=8, seed=seed)


def _generate(server: HFRolloutServer, requests: list[tuple[list[int], dict]]) -> list:
    async def together():
        calls = [server.generate(p, {"max_tokens": 8, **s}, f"r{i}") for i, (p, s) in enumerate(requests)]
        return await asyncio.gather(*calls)

    return asyncio.run(together())


def test_a_seeded_request_samples_the_same_alone_and_in_a_batch(tiny):
    sampling = {"temperature": 1.0, "seed": 1234}
    (alone,) = _generate(_server(tiny), [(PROMPTS[0], sampling)])
    server = _server(tiny, seed=7)  # another server seed: only the request's own seed counts
    others = [{"temperature": 1.0, "seed": 5}, {"temperature": 1.0}, {"temperature": 1.0, "seed": 6}]
    requests = [(PROMPTS[1], others[0]), (PROMPTS[0], sampling), (PROMPTS[2], others[1]), (PROMPTS[3], others[2])]
    batched = _generate(server, requests)
    assert server.stats["batches"] == 1  # the four requests shared one padded batch
    assert batched[1].token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(batched[1].log_probs), torch.tensor(alone.log_probs), atol=1e-5)


def test_different_seeds_sample_differently_and_a_server_without_request_seeds_follows_its_own(tiny):
    seeded = _generate(_server(tiny), [(PROMPTS[0], {"temperature": 1.0, "seed": s}) for s in range(4)])
    samples = [tuple(o.token_ids) for o in seeded]
    assert len(set(samples)) > 1, samples
    unseeded = [_generate(_server(tiny, seed), [(PROMPTS[0], {"temperature": 1.0})] * 4) for seed in (0, 0, 1)]
    unseeded = [[tuple(o.token_ids) for o in outputs] for outputs in unseeded]
    assert unseeded[0] == unseeded[1] != unseeded[2]


def test_top_k_acts_before_the_draw(tiny):
    greedy = _generate(_server(tiny), [(p, {"temperature": 0.0}) for p in PROMPTS])
    top_1 = _generate(_server(tiny), [(p, {"temperature": 1.0, "top_k": 1, "seed": i}) for i, p in enumerate(PROMPTS)])
    assert [o.token_ids for o in top_1] == [o.token_ids for o in greedy]


def test_log_probs_are_those_of_the_sampled_tokens_at_the_temperature(tiny):
    from transformers import AutoModelForCausalLM

    temperature = 0.7
    outputs = _generate(_server(tiny), [(p, {"temperature": temperature, "seed": i}) for i, p in enumerate(PROMPTS)])
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa").eval()
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        full = torch.tensor([prompt + output.token_ids])
        with torch.no_grad():
            logits = model(full).logits.float()[0, len(prompt) - 1 : -1] / temperature
        wanted = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(output.token_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(output.log_probs), wanted, atol=1e-4)
