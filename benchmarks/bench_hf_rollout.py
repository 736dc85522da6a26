"""Throughput of the ``hf`` rollout server versus plain Hugging Face ``generate()`` at the same batch size.

Usage::

    python benchmarks/bench_hf_rollout.py                                             # tiny model, batch 16
    python benchmarks/bench_hf_rollout.py --model smollm2 --batch-size 8 --max-tokens 32 --repeats 2
    python benchmarks/bench_hf_rollout.py --model /path/to/hf-folder --ray            # also through a Ray actor

One run loads the model twice in this process: once inside :class:`HFRolloutServer` (driven directly with
``asyncio.gather`` over ``--batch-size`` concurrent requests, which the server batches into one ``generate()``) and
once as a plain ``AutoModelForCausalLM`` for the baseline (one left-padded ``model.generate()`` over the same
prompts). The variants run interleaved, ``--repeats`` times each, re-seeded identically before every run; the
report gives the median generated tokens per second of each and ``server / baseline`` (target >= 0.8).

Both sides produce exactly ``--max-tokens`` tokens per sequence: the baseline through ``min_new_tokens`` (eos is
masked), the server through an eos id outside the vocabulary (never sampled). The baseline samples at temperature
1.0 from the full distribution (``top_k=0``, ``top_p=1.0``); the server gets ``{"temperature": 1.0, "max_tokens": T}``
(no top-k / top-p requested) and samples however ``hf_server.py`` turns that into a ``GenerationConfig``. Tokens are
counted from what each side returned. (The Ray actor is seeded once at start, not before every run.)

Wall-clock tokens/s is the headline; tokens per CPU-second of this process (``time.process_time``) is printed
next to it as a cross-check that other load on the machine cannot skew (it leaves out the server's idle
``batch_wait_ms``, and is not available for the Ray actor, which runs in another process).

Also reported: the server with the same requests awaited one at a time (what batching buys), optionally the server
as a Ray actor (``--ray``), and the server's own time inside ``generate()`` (its ``stats``), which separates
asyncio / thread hand-off overhead from the cost of the generate call itself.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_system.cpu_backend.hf_server import HFRolloutServer


def _resolve_model(name: str, workdir: str) -> str:
    if name == "tiny":
        from agent_system.models.tiny import build_tiny_model

        return build_tiny_model(Path(workdir) / "tiny", seed=0)
    if name == "smollm2":
        from agent_system.models.smollm2 import ensure_smollm2

        return ensure_smollm2()
    return name


def _prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        a, b, op = rng.randint(2, 999), rng.randint(2, 999), rng.choice(["+", "-", "*"])
        question = f"What is {a} {op} {b}? Answer with a number."
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        prompts.append([int(t) for t in encoded["input_ids"]])
    return prompts


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt) :] = 1
    return input_ids, attention_mask


class Bench:
    def __init__(self, args: argparse.Namespace, model_path: str) -> None:
        self.args = args
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.prompts = _prompts(tokenizer, args.batch_size, args.seed)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        # An eos id the model can never sample: the server then always runs to max_tokens, like min_new_tokens.
        self.unreachable_eos = int(self.model.config.vocab_size)
        self.max_model_len = max(len(p) for p in self.prompts) + args.max_tokens
        self.server_init = dict(
            model_path=model_path,
            dtype="float32",
            eos_token_ids=[self.unreachable_eos],
            pad_token_id=self.pad_id,
            max_model_len=self.max_model_len,
            default_max_tokens=args.max_tokens,
            options={"max_batch_size": args.batch_size, "batch_wait_ms": 5, "num_threads": args.threads},
            seed=args.seed,
        )
        self.server = HFRolloutServer(**self.server_init)
        self.ray_handle = None
        self.sampling = {"temperature": 1.0, "max_tokens": args.max_tokens}

    # ------------------------------------------------------------------ variants; each returns generated tokens
    async def baseline(self) -> int:
        input_ids, attention_mask = _left_pad(self.prompts, self.pad_id)
        with torch.no_grad():
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=self.args.max_tokens,
                min_new_tokens=self.args.max_tokens,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
            )
        generated = sequences[:, input_ids.shape[1] :]
        # eos is masked for all max_tokens steps, so every row holds max_tokens real tokens.
        return int(generated.numel())

    async def server_batched(self) -> int:
        outputs = await asyncio.gather(
            *[self.server.generate(p, dict(self.sampling), str(i)) for i, p in enumerate(self.prompts)]
        )
        return sum(len(o.token_ids) for o in outputs)

    async def server_sequential(self) -> int:
        total = 0
        for i, p in enumerate(self.prompts):
            total += len((await self.server.generate(p, dict(self.sampling), str(i))).token_ids)
        return total

    async def server_ray(self) -> int:
        outputs = await asyncio.gather(
            *[self.ray_handle.generate.remote(p, dict(self.sampling), str(i)) for i, p in enumerate(self.prompts)]
        )
        return sum(len(o.token_ids) for o in outputs)

    # ------------------------------------------------------------------ driver
    async def run(self) -> None:
        args = self.args
        variants: dict[str, Callable[[], Awaitable[int]]] = {
            "hf generate (baseline)": self.baseline,
            "server, batched": self.server_batched,
        }
        if args.ray:
            variants["server via Ray, batched"] = self.server_ray
        if not args.no_sequential:
            variants["server, one at a time"] = self.server_sequential
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpu_rates: dict[str, list[float]] = {name: [] for name in variants}  # tokens per CPU-second of this process
        counts: dict[str, int] = {}
        inside: list[float] = []  # server tokens/s measured by its own generate_seconds (batched runs)

        for name, fn in variants.items():  # warm-up, untimed
            torch.manual_seed(args.seed)
            await fn()
            print(f"warmed up: {name}", flush=True)
        for rep in range(args.repeats):
            for name, fn in variants.items():
                torch.manual_seed(args.seed + rep)
                before = self.server.get_stats()
                start, cpu_start = time.perf_counter(), time.process_time()
                tokens = await fn()
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
                rates[name].append(tokens / seconds)
                cpu_rates[name].append(tokens / max(cpu_seconds, 1e-9))
                counts[name] = tokens
                if name == "server, batched":
                    after = self.server.get_stats()
                    inside.append(
                        (after["generated_tokens"] - before["generated_tokens"])
                        / (after["generate_seconds"] - before["generate_seconds"])
                    )
                print(
                    f"  rep {rep + 1}/{args.repeats}  {name:<26} {tokens:6d} tokens  {seconds:7.2f} s  "
                    f"{tokens / seconds:9.1f} tok/s  (cpu {cpu_seconds:7.2f} s)",
                    flush=True,
                )

        median = {name: statistics.median(values) for name, values in rates.items()}
        cpu_median = {name: statistics.median(values) for name, values in cpu_rates.items()}
        base, cpu_base = median["hf generate (baseline)"], cpu_median["hf generate (baseline)"]
        print()
        print(
            f"model={args.model}  batch={args.batch_size}  max_tokens={args.max_tokens}  repeats={args.repeats}  "
            f"threads={torch.get_num_threads()}  prompt_len={min(map(len, self.prompts))}-"
            f"{max(map(len, self.prompts))}"
        )
        print(
            f"{'variant':<28}{'tokens/run':>11}{'median tok/s':>14}{'vs baseline':>13}"
            f"{'tok/cpu-s':>12}{'vs baseline':>13}"
        )
        for name, value in median.items():
            cpu = (
                f"{'n/a (other process)':>25}"
                if "Ray" in name
                else f"{cpu_median[name]:>12.1f}{cpu_median[name] / cpu_base:>13.3f}"
            )
            print(f"{name:<28}{counts[name]:>11d}{value:>14.1f}{value / base:>13.3f}{cpu}")
        print(
            f"{'(server time inside generate)':<28}{'':>11}{statistics.median(inside):>14.1f}"
            f"{statistics.median(inside) / base:>13.3f}"
        )
        ratio = median["server, batched"] / base
        cpu_ratio = cpu_median["server, batched"] / cpu_base
        print(
            f"ratio server/baseline = {ratio:.3f} wall-clock ({'meets' if ratio >= 0.8 else 'BELOW'} the 0.8 target); "
            f"{cpu_ratio:.3f} per CPU-second"
        )


async def _start_ray_actor(bench: Bench) -> None:
    import ray

    handle = (
        ray.remote(HFRolloutServer)
        .options(num_cpus=0, max_concurrency=max(64, 2 * bench.args.batch_size))
        .remote(**bench.server_init)
    )
    await handle.get_stats.remote()  # model loaded
    bench.ray_handle = handle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (built in a temp dir), smollm2, or a HF folder path")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (also the server's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ray", action="store_true", help="also measure the server as a Ray actor")
    parser.add_argument("--no-sequential", action="store_true", help="skip the one-request-at-a-time variant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="bench-hf-rollout-") as workdir:
        model_path = _resolve_model(args.model, workdir)
        bench = Bench(args, model_path)

        async def go() -> None:
            if args.ray:
                await _start_ray_actor(bench)
            await bench.run()

        if not args.ray:
            asyncio.run(go())
            return
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            asyncio.run(go())
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
