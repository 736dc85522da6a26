"""Export a checkpoint's solver (LL) and feedback writer (HL) as Hugging Face model folders.

    python -m agent_system.launcher.export --run-dir outputs/mlmt_rl/default [--step N] [--out DIR] \\
        [--base ll=PATH] [--base hl=PATH]

Reads ``<run-dir>/checkpoints/global_step_N/{ll,hl}`` (N defaults to the latest complete checkpoint) and writes
``<out>/ll`` and ``<out>/hl`` (default ``<run-dir>/export/global_step_N``), each loadable with
``AutoModelForCausalLM.from_pretrained``. Merging the FSDP shards is verl's own model merger.

A level trained with LoRA (``<tree>.model.lora_rank`` > 0) also gets ``<out>/<level>_adapter``, a PEFT adapter
folder (``adapter_config.json``, ``adapter_model.safetensors``) for ``peft.PeftModel.from_pretrained`` over the
level's base model (its ``model.path``), and ``<out>/<level>`` is the base with the adapter merged in. An
adapters-only checkpoint (``+<tree>.actor.checkpoint.save_lora_only=true``) holds no base weights: give the base
with ``--base <level>=PATH`` (a Hugging Face folder or hub id). A base given for a level is also recorded as the
adapter's ``base_model_name_or_path``. All weights are bfloat16, as verl's merger writes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from agent_system.models import TOKEN_BUDGETS
from agent_system.trainer import state as st

logger = logging.getLogger(__name__)

LEVELS = ("ll", "hl")


def export_checkpoint(
    run_dir: str, step: int | None = None, out: str | None = None, bases: dict[str, str] | None = None
) -> dict[str, str]:
    """Merge each level's FSDP checkpoint into a HF folder; returns {level: folder}, plus {"<level>_adapter":
    folder} for a LoRA level. ``bases``: {level: base model path or hub id} (module docstring)."""
    from agent_system import verl_compat as vc

    bases = dict(bases or {})
    unknown = sorted(set(bases) - set(LEVELS))
    if unknown:
        raise ValueError(f"bases for unknown levels {unknown}: the levels are {list(LEVELS)}")
    root = Path(run_dir) / "checkpoints"
    step = step if step is not None else st.latest_step(root)
    if step is None:
        raise FileNotFoundError(
            f"no complete checkpoint under {root} (looked for {st.LATEST}): give --run-dir the "
            "trainer.default_local_dir of a run that saved one (trainer.save_freq > 0 saves every N steps and at "
            "the last; bash scripts/run_main.sh writes outputs/mlmt_rl/default)"
        )
    source = st.step_dir(root, step)
    target = Path(out) if out else Path(run_dir) / "export" / f"global_step_{step}"
    written = {}
    for level in LEVELS:
        level_dir = source / level
        if not level_dir.is_dir():
            logger.info("%s: no %s checkpoint (frozen level); skipped", source, level)
            continue
        merged = vc.merge_fsdp_checkpoint(str(level_dir), str(target / level))
        written[level] = merged.folder
        if merged.adapter is not None:
            written[f"{level}_adapter"] = _export_lora(level, level_dir, merged, target, bases.get(level))
        elif level in bases:
            raise ValueError(f"--base {level}=...: {level_dir} was trained without LoRA, it has no adapter to merge")
        logger.info("exported %s -> %s", level_dir, written[level])
    if not written:
        raise FileNotFoundError(f"{source} holds neither an ll nor an hl checkpoint")
    write_token_budgets(Path(run_dir), target)
    return written


def write_token_budgets(run_dir: Path, target: Path) -> None:
    """``<target>/token_budgets.json``: the run's prompt, solver and feedback budgets per turn, from its run plan, so
    that an evaluation defaults to the lengths the run trained with (``agent_system.eval.math500``). Nothing is
    written for a run without a plan or one whose plan predates the budgets."""
    plan_path = run_dir / "run_plan.json"
    if not plan_path.is_file():
        return
    levels = json.loads(plan_path.read_text())["levels"]
    if "response_tokens" not in levels["ll"]:
        return
    budgets = {
        "max_prompt_tokens": levels["ll"]["prompt_tokens"],
        "max_tokens": levels["ll"]["response_tokens"],
        "feedback_tokens": levels["hl"]["response_tokens"] if "hl" in levels else None,
    }
    (target / TOKEN_BUDGETS).write_text(json.dumps(budgets, indent=2) + "\n")


def _export_lora(level: str, level_dir: Path, merged: object, target: Path, base: str | None) -> str:
    """Move verl's adapter folder (``merged``: a ``verl_compat.MergedCheckpoint``) to ``<target>/<level>_adapter``
    and write ``<target>/<level>`` as the base with the adapter merged in (PEFT's ``merge_and_unload``, computed in
    float32, saved in bfloat16); returns the adapter folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from agent_system.models.adapter import merge_into

    merged_dir, adapter_dir = Path(merged.folder), target / f"{level}_adapter"
    has_base_weights = merged.base_weights
    if not has_base_weights and base is None:
        raise FileNotFoundError(
            f"{level_dir} is an adapters-only checkpoint (save_lora_only): it holds no base weights to merge the "
            f"adapter into; give the level's base model (its model.path) with --base {level}=PATH"
        )
    if adapter_dir.exists():
        shutil.rmtree(adapter_dir)
    shutil.move(merged.adapter, str(adapter_dir))
    if base is not None:
        config_path = adapter_dir / "adapter_config.json"
        adapter_config = json.loads(config_path.read_text())
        adapter_config["base_model_name_or_path"] = base
        config_path.write_text(json.dumps(adapter_config, indent=4) + "\n")

    model = AutoModelForCausalLM.from_pretrained(str(merged_dir) if has_base_weights else base, dtype=torch.float32)
    merge_into(model, str(adapter_dir), str(merged_dir), torch.bfloat16)
    if not has_base_weights:  # the tokenizer and generation config verl saved beside the shards
        hf_dir = level_dir / "huggingface"
        AutoTokenizer.from_pretrained(str(hf_dir)).save_pretrained(str(merged_dir))
        if (hf_dir / "generation_config.json").is_file():
            GenerationConfig.from_pretrained(str(hf_dir)).save_pretrained(str(merged_dir))
    logger.info("%s: LoRA adapter -> %s, merged into the base -> %s", level, adapter_dir, merged_dir)
    return str(adapter_dir)


def parse_bases(values: list[str] | None) -> dict[str, str]:
    """``["ll=PATH", ...]`` -> {"ll": "PATH", ...}; a value that is not ``<level>=PATH`` raises, naming it."""
    bases = {}
    for value in values or []:
        level, sep, path = value.partition("=")
        if not sep or level not in LEVELS or not path:
            raise ValueError(f"--base {value!r}: expected <level>=PATH with level one of {list(LEVELS)}")
        bases[level] = path
    return bases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="trainer.default_local_dir of the run")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--out", default=None, help="output folder (default: <run-dir>/export/global_step_N)")
    parser.add_argument(
        "--base",
        action="append",
        metavar="LEVEL=PATH",
        help="a LoRA level's base model (its model.path): needed for an adapters-only checkpoint; repeatable",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        export_checkpoint(args.run_dir, args.step, args.out, parse_bases(args.base))
    except (FileNotFoundError, ValueError) as error:  # the message names the input to give or fix
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
