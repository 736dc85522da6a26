"""docs/REPRODUCING.md: the scripts it names exist, the headline run is one script wherever the docs name it, and its
2 × 8 launch commands are the runs its GPU-hours table counts.

The commands are read from the page's code block (the `sbatch` lines), run through their scripts with a stub
interpreter that records the argv (as tests/unit/test_experiment_scripts_on_cpu.py does), composed and checked as
start-up does, and planned (agent_system/launcher/plan.py) with MATH's 7,500 training problems.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agent_system.config import compose_config
from agent_system.launcher.main import check_config, set_schedule_horizon
from agent_system.launcher.plan import build_plan

pytestmark = pytest.mark.external  # runs the bash experiment scripts

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "REPRODUCING.md"
HEADLINE = "mlmt-configs/math/HLT_LLT_RR_1_10.sh"
MODELS = {"$M1": "meta-llama/Llama-3.2-1B-Instruct", "$M3": "meta-llama/Llama-3.2-3B-Instruct"}


def test_every_script_the_page_names_exists():
    named = set(re.findall(r"\b((?:mlmt-configs|recipes|scripts|examples)/[\w./-]+\.(?:sh|sbatch))", PAGE.read_text()))
    assert HEADLINE in named and "recipes/grpo/run_grpo.sh" in named and "recipes/compare.sh" in named
    missing = sorted(name for name in named if not (REPO / name).is_file())
    assert not missing, f"docs/REPRODUCING.md names scripts the repository lacks: {missing}"


def test_the_headline_run_is_one_script_in_readme_method_and_the_page():
    readme = (REPO / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if "(headline)" in line]
    assert "`math/HLT_LLT_RR_1_10.sh` (headline)" in row
    assert "recommended" not in readme  # the GRPO variant is the project's, not the paper's run
    method = re.sub(r"\s+", " ", (REPO / "docs" / "METHOD.md").read_text())
    assert f"`{HEADLINE}`, is the headline run" in method
    page = PAGE.read_text()
    assert f"| **Bi-NAC** | **`{HEADLINE}`** |" in page
    assert "**Why `HLT_LLT_RR_1_10.sh` is the headline run.**" in page


def _commands() -> list[tuple[dict[str, str], int, str, list[str]]]:
    """(environment, nodes, script, overrides) of each sbatch command in the page's code blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    commands = []
    for line in "".join(blocks).replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "sbatch" not in words or "=" not in words[0]:
            continue
        at = words.index("sbatch")
        env = {k: MODELS.get(v, v) for k, v in (w.split("=", 1) for w in words[:at])}
        batch = next(i for i, w in enumerate(words) if w.endswith(".sbatch"))
        assert words[batch] == "mlmt-configs/math/submit_mlmt.sbatch", line
        nodes = int(next(w.split("=")[1] for w in words[at:batch] if w.startswith("--nodes=")))
        assert f"--gpus-per-node={8}" in words[at:batch], line
        commands.append((env, nodes, words[batch + 1], words[batch + 2 :]))
    return commands


def _config(env: dict[str, str], nodes: int, script: str, overrides: list[str], tmp_path: Path):
    record, stub = tmp_path / "argv", tmp_path / "python-stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_RECORD"\n')
    stub.chmod(0o755)
    run_env = {**os.environ, **env, "MLMT_PYTHON": str(stub), "ARGV_RECORD": str(record)}
    # as the sbatch script runs it: the script, the job's node count, then the command's overrides
    argv = ["bash", str(REPO / script), f"trainer.nnodes={nodes}", *overrides]
    result = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=30, cwd=REPO)
    assert result.returncode == 0, result.stderr
    recorded = record.read_text().split("\0")[:-1]
    config = compose_config(recorded[2:])
    check_config(config)
    return config


def test_the_launch_commands_are_the_runs_the_gpu_hours_count(tmp_path):
    commands = _commands()
    assert [(c[2], c[1]) for c in commands] == [
        (HEADLINE, 2),
        (HEADLINE, 2),
        ("recipes/grpo/run_grpo.sh", 1),
        ("recipes/grpo/run_grpo.sh", 1),
    ]
    plans, configs = [], []
    for env, nodes, script, overrides in commands:
        config = _config(env, nodes, script, overrides, tmp_path)
        set_schedule_horizon(config, 7500)
        plans.append(build_plan(config, 7500, 500))
        configs.append(config)
    bi_nac, fixed, grpo_1b, grpo_3b = plans
    for plan, config in zip(plans, configs, strict=True):
        assert plan.total_steps == 500 and plan.checkpoint_steps[-1] == 500
        assert config.trainer.nnodes * config.trainer.n_gpus_per_node == 8 * len(plan.levels)  # every GPU used
    # generations per step, (updates, rows per update, optimizer steps per update) per level: the page's table
    assert bi_nac.samples_per_step == fixed.samples_per_step == 384
    assert [(lv.updates, lv.rows_per_update, lv.optimizer_steps_per_update) for lv in bi_nac.levels.values()] == [
        (455, 256, 2),
        (45, 128, 1),
    ]
    ll, hl = fixed.levels.values()
    assert (ll.updates, ll.rows_per_update, ll.optimizer_steps_per_update) == (500, 256, 2) and hl.frozen
    for plan in (grpo_1b, grpo_3b):
        (ll,) = plan.levels.values()
        assert plan.samples_per_step == 512 and (ll.updates, ll.rows_per_update, ll.optimizer_steps_per_update) == (
            500,
            512,
            4,
        )
    assert [c.actor_rollout_ref.model.path for c in configs] == [MODELS["$M1"]] * 3 + [MODELS["$M3"]]
    names = [c.trainer.experiment_name for c in configs]
    assert len(set(names)) == 4, names  # four run folders: no run resumes another


def test_fixed_feedback_is_the_headline_with_the_feedback_writer_frozen_and_nothing_else(tmp_path):
    bi_nac, fixed = (_config(env, n, s, o, tmp_path) for env, n, s, o in _commands()[:2])
    a = _flatten(OmegaConf.to_container(bi_nac, resolve=False))
    b = _flatten(OmegaConf.to_container(fixed, resolve=False))
    differ = sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key))
    assert differ == ["mlmt.hl.freeze", "trainer.experiment_name"]


def _flatten(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat
