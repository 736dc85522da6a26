"""Trainer-side memory of the two levels (LL, HL) as two full models, two LoRA models, or two adapters on one base.

Usage::

    python benchmarks/bench_lora_memory.py                              # tiny Qwen2, hidden 512, 8 layers
    python benchmarks/bench_lora_memory.py --hidden-size 768 --num-layers 12 --batch-size 2
    python benchmarks/bench_lora_memory.py --model smollm2              # the embedded SmolLM2-135M (~5 GB for (1))
    python benchmarks/bench_lora_memory.py --model /path/to/hf-folder --dtype bfloat16

Each configuration runs in a fresh child process (this script re-run with ``--child``), one after the other, so
allocations never mix; every child loads the same base model for both levels and does one optimizer step per level
on the same small random batch (``--batch-size`` x ``--seq-len`` tokens, next-token loss):

1. ``full``: two full models, each with its own ``torch.optim.AdamW`` over all its parameters;
2. ``lora_two_bases``: two copies of the base, each wrapped by PEFT's ``get_peft_model`` with one adapter, each with
   its own AdamW over its adapter;
3. ``lora_shared_base``: one base, ``get_peft_model(..., adapter_name="ll")`` then ``add_adapter("hl", ...)``; one AdamW
   per adapter over that adapter's tensors only; before each level's step ``set_adapter`` makes it the active one.

After the steps the child reports its peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which
includes transient load-time copies), its RSS at the end (``psutil``: everything the two levels keep between steps),
its RSS after imports (the Python + torch baseline), and the bytes counted from the tensors themselves (weights and
buffers split into trainable and frozen, gradients, optimizer state; each storage counted once). The table gives the
absolute values and the ratios to configuration (1). Configuration (3) also checks that the HL's step leaves the LL's
adapter untouched and that the base with adapters off (``disable_adapter``, the reference) is unchanged by both steps.

Only the trainer side on CPU is measured: no FSDP, no vLLM. The LoRA settings default to r 16, alpha 32 on the seven
projections (``q,k,v,o,gate,up,down``), the same keys a level sets with ``<tree>.model.lora_rank`` etc.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

CONFIGS = {
    "full": "(1) two full models, full fine-tuning",
    "lora_two_bases": "(2) two LoRA models (two base copies)",
    "lora_shared_base": "(3) two adapters on one base",
}
LEVELS = ("ll", "hl")
RESULT_MARK = "BENCH_LORA_MEMORY_RESULT "
MIB = 1024**2


# ---------------------------------------------------------------------------------------------- child process
def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kilobytes on Linux


class _StorageCounter:
    """Bytes of tensors, each underlying storage counted once (tied weights, views)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def __call__(self, tensors) -> int:
        total = 0
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() in self.seen:
                continue
            self.seen.add(storage.data_ptr())
            total += storage.nbytes()
        return total


def _count_tensors(models: list, optimizers: list) -> dict[str, int]:
    import torch

    trainable_ids = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    params = [p for model in models for p in model.parameters()]
    buffers = [b for model in models for b in model.buffers()]
    count = _StorageCounter()
    trainable = count(p for p in params if id(p) in trainable_ids)
    frozen = count([p for p in params if id(p) not in trainable_ids] + buffers)
    grads = count(p.grad for p in params if p.grad is not None)
    states = [value for opt in optimizers for entry in opt.state.values() for value in entry.values()]
    state = count(value for value in states if torch.is_tensor(value))
    return {
        "trainable_bytes": trainable,
        "frozen_bytes": frozen,
        "grad_bytes": grads,
        "optim_bytes": state,
        "tensor_bytes": trainable + frozen + grads + state,
        "trainable_numel": sum(p.numel() for p in params if id(p) in trainable_ids),
    }


def _lora_config(args: argparse.Namespace):
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        target_modules=list(args.target_modules),
        bias="none",
    )


def _step(model, optimizer, batch) -> float:
    """One next-token step; gradients are left in place, as between backward and the next zero_grad."""
    model.train()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _adapter_params(peft_model, name: str) -> list:
    return [p for n, p in peft_model.named_parameters() if "lora_" in n and f".{name}." in n]


def run_child(args: argparse.Namespace) -> dict:
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    baseline = _rss()
    generator = torch.Generator().manual_seed(args.seed)

    def load():
        torch.manual_seed(args.seed)
        return AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype, attn_implementation="sdpa")

    first = load()
    vocab = first.config.vocab_size
    batch = torch.randint(0, vocab, (args.batch_size, args.seq_len), generator=generator)
    losses: dict[str, float] = {}
    checks: dict[str, float | bool] = {}
    models: list = []
    optimizers: list = []
    if args.child == "full":
        models = [first, load()]
        for level, model in zip(LEVELS, models, strict=True):
            optimizers.append(torch.optim.AdamW(model.parameters(), lr=args.lr))
            losses[level] = _step(model, optimizers[-1], batch)
    elif args.child == "lora_two_bases":
        models = [get_peft_model(first, _lora_config(args)), get_peft_model(load(), _lora_config(args))]
        for level, model in zip(LEVELS, models, strict=True):
            optimizers.append(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr))
            losses[level] = _step(model, optimizers[-1], batch)
    elif args.child == "lora_shared_base":
        model = get_peft_model(first, _lora_config(args), adapter_name=LEVELS[0])
        model.add_adapter(LEVELS[1], _lora_config(args))
        models = [model]
        probe = batch[:1]
        with torch.no_grad(), model.disable_adapter():
            reference_before = model(input_ids=probe).logits
        per_level = {level: _adapter_params(model, level) for level in LEVELS}
        assert all(per_level.values()) and not set(map(id, per_level["ll"])) & set(map(id, per_level["hl"]))
        optimizers = [torch.optim.AdamW(per_level[level], lr=args.lr) for level in LEVELS]
        for level, optimizer in zip(LEVELS, optimizers, strict=True):
            model.set_adapter(level)
            checks[f"only {level} trainable while active"] = all(p.requires_grad for p in per_level[level]) and not any(
                p.requires_grad for other in LEVELS if other != level for p in per_level[other]
            )
            before = [p.detach().clone() for p in per_level[LEVELS[0]]] if level == LEVELS[1] else None
            losses[level] = _step(model, optimizer, batch)
            if before is not None:
                checks["hl step left ll adapter unchanged"] = all(
                    torch.equal(a, b) for a, b in zip(before, per_level[LEVELS[0]], strict=True)
                )
                del before
        with torch.no_grad():
            with model.disable_adapter():
                reference_after = model(input_ids=probe).logits
            active = {}
            for level in LEVELS:
                model.set_adapter(level)
                active[level] = model(input_ids=probe).logits
        checks["reference (adapters off) max |dlogit| after both steps"] = float(
            (reference_after - reference_before).abs().max()
        )
        checks["ll vs hl adapter max |dlogit|"] = float((active["ll"] - active["hl"]).abs().max())
        del reference_before, reference_after, active
    else:
        raise ValueError(f"unknown configuration {args.child!r}")
    counts = _count_tensors(models, optimizers)
    return {
        "config": args.child,
        "baseline_rss": baseline,
        "end_rss": _rss(),
        "peak_rss": _peak_rss(),
        "losses": losses,
        "checks": checks,
        **counts,
    }


# ---------------------------------------------------------------------------------------------- parent process
def _model_path(args: argparse.Namespace, workdir: str) -> str:
    if args.model == "tiny":
        from agent_system.models.tiny import build_tiny_model

        return build_tiny_model(
            Path(workdir) / "tiny", seed=args.seed, hidden_size=args.hidden_size, num_layers=args.num_layers
        )
    from agent_system.models.resolve import resolve_model_path

    return resolve_model_path(args.model, "--model")


def _run_config(name: str, model_path: str, argv: list[str]) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--model-path", model_path, *argv]
    logger.info("running %s in a fresh process", name)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"configuration {name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if not lines:
        raise RuntimeError(f"configuration {name} printed no result:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len(RESULT_MARK) :])


def _mib(value: int) -> str:
    return f"{value / MIB:,.1f}"


def print_table(results: list[dict], args: argparse.Namespace, model_path: str) -> None:
    base = next((r for r in results if r["config"] == "full"), results[0])  # the ratios' denominator
    print(
        f"model: {args.model} ({model_path}), dtype {args.dtype}, batch {args.batch_size} x {args.seq_len} tokens, "
        f"LoRA r {args.lora_rank} alpha {args.lora_alpha} on {','.join(args.target_modules)}; "
        f"one optimizer step per level; trainer side on CPU only (no vLLM)"
    )
    print()
    print(
        "| configuration | trainable params | weights MiB (trainable / frozen) | grads MiB | AdamW state MiB "
        "| tensors MiB | ratio to (1) | peak RSS MiB | RSS at end MiB | RSS at end over baseline MiB "
        "| ratio to (1) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_over = base["end_rss"] - base["baseline_rss"]
    for result in results:
        over = result["end_rss"] - result["baseline_rss"]
        print(
            f"| {CONFIGS[result['config']]} | {result['trainable_numel']:,} "
            f"| {_mib(result['trainable_bytes'])} / {_mib(result['frozen_bytes'])} "
            f"| {_mib(result['grad_bytes'])} | {_mib(result['optim_bytes'])} | {_mib(result['tensor_bytes'])} "
            f"| {result['tensor_bytes'] / base['tensor_bytes']:.3f} | {_mib(result['peak_rss'])} "
            f"| {_mib(result['end_rss'])} | {_mib(over)} | {over / base_over:.3f} |"
        )
    print()
    print(
        "peak RSS / (1): "
        + ", ".join(f"({i + 1}) {r['peak_rss'] / base['peak_rss']:.3f}" for i, r in enumerate(results))
        + f"; RSS after imports (baseline) {_mib(base['baseline_rss'])} MiB"
    )
    for result in results:
        losses = ", ".join(f"{level} {loss:.3f}" for level, loss in result["losses"].items())
        checks = "; ".join(f"{key}: {value}" for key, value in result["checks"].items())
        print(f"{result['config']}: step losses {losses}" + (f"; {checks}" if checks else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (built in a temp dir), smollm2, or a HF folder path")
    parser.add_argument("--hidden-size", type=int, default=512, help="tiny model: hidden size (multiple of 64)")
    parser.add_argument("--num-layers", type=int, default=8, help="tiny model: decoder layers")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument(
        "--target-modules",
        nargs="+",
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each child")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.child:
        print(RESULT_MARK + json.dumps(run_child(args)), flush=True)
        return

    shared = [
        f"--dtype={args.dtype}",
        f"--batch-size={args.batch_size}",
        f"--seq-len={args.seq_len}",
        f"--lora-rank={args.lora_rank}",
        f"--lora-alpha={args.lora_alpha}",
        "--target-modules",
        *args.target_modules,
        f"--lr={args.lr}",
        f"--threads={args.threads}",
        f"--seed={args.seed}",
    ]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="bench-lora-memory-") as workdir:
        model_path = _model_path(args, workdir)
        results = [_run_config(name, model_path, shared) for name in args.configs]
        print_table(results, args, model_path)


if __name__ == "__main__":
    main()
