"""Export a checkpoint's solver (LL) and feedback writer (HL) as Hugging Face model folders.

    python -m agent_system.trainer.export --run-dir outputs/mlmt_rl/default [--step N] [--out DIR]

Reads ``<run-dir>/checkpoints/global_step_N/{ll,hl}`` (N defaults to the latest complete checkpoint) and writes
``<out>/ll`` and ``<out>/hl`` (default ``<run-dir>/export/global_step_N``), each loadable with
``AutoModelForCausalLM.from_pretrained``. Merging the FSDP shards is verl's own model merger.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agent_system.trainer import state as st

logger = logging.getLogger(__name__)


def export_checkpoint(run_dir: str, step: int | None = None, out: str | None = None) -> dict[str, str]:
    """Merge each level's FSDP checkpoint into a HF folder; returns {level: folder}."""
    from agent_system import verl_compat as vc

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
    for level in ("ll", "hl"):
        level_dir = source / level
        if not level_dir.is_dir():
            logger.info("%s: no %s checkpoint (frozen level); skipped", source, level)
            continue
        written[level] = vc.merge_fsdp_checkpoint(str(level_dir), str(target / level))
        logger.info("exported %s -> %s", level_dir, written[level])
    if not written:
        raise FileNotFoundError(f"{source} holds neither an ll nor an hl checkpoint")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="trainer.default_local_dir of the run")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--out", default=None, help="output folder (default: <run-dir>/export/global_step_N)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        export_checkpoint(args.run_dir, args.step, args.out)
    except FileNotFoundError as error:  # no checkpoint: the message names the run folder to give
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
