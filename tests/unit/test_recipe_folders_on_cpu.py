"""One place per baseline: every folder under recipes/ holds its README.md and its run script, recipes/README.md lists
each command, and the fixed-feedback and HL-only folders run the seed's scripts (mlmt-configs/math/HLF_LLT_RR_1_1.sh,
HLT_LLF_RR_1_1.sh) with exactly their arguments, so both names start the same run.

Scripts run through bash with MLMT_PYTHON set to a stub that records the argv they would give
`python -m verl.trainer.main_mlmt`; nothing trains.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.external  # runs the recipes' bash scripts

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(path.name for path in (REPO / "recipes").iterdir() if path.is_dir())
SEED_SCRIPTS = {
    "fixed_feedback": "mlmt-configs/math/HLF_LLT_RR_1_1.sh",
    "hl_only": "mlmt-configs/math/HLT_LLF_RR_1_1.sh",
}


def _argv(script: str, tmp_path: Path, *extra: str) -> list[str]:
    record, stub = tmp_path / f"{Path(script).stem}.argv", tmp_path / "python-stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_RECORD"\n')
    stub.chmod(0o755)
    env = {**os.environ, "MLMT_PYTHON": str(stub), "ARGV_RECORD": str(record)}
    result = subprocess.run(
        ["bash", str(REPO / script), *extra], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    return record.read_text().split("\0")[:-1]


def test_every_baseline_has_a_folder():
    expected = {"grpo", "score", "rl_guided_score", "value_shaping", "archer", "reinforce_kl", "custom_yaml"}
    assert expected | set(SEED_SCRIPTS) <= set(RECIPES), RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_folder_has_its_readme_and_command(name):
    folder = REPO / "recipes" / name
    command = f"bash recipes/{name}/run_{name}.sh"
    assert (folder / f"run_{name}.sh").is_file(), f"recipes/{name}/ has no run_{name}.sh"
    assert os.access(folder / f"run_{name}.sh", os.X_OK), f"recipes/{name}/run_{name}.sh is not executable"
    readme = folder / "README.md"
    assert readme.is_file(), f"recipes/{name}/ has no README.md (what it is, its source, the command)"
    text = readme.read_text(encoding="utf-8")
    assert command in text, f"recipes/{name}/README.md does not show its command `{command}`"
    assert "source" in text.lower(), f"recipes/{name}/README.md does not name its source"
    assert command in (REPO / "recipes" / "README.md").read_text(encoding="utf-8"), f"recipes/README.md lacks {command}"


@pytest.mark.parametrize("name", sorted(SEED_SCRIPTS))
def test_recipe_runs_the_seed_script_with_its_arguments(name, tmp_path):
    extra = ("trainer.total_training_steps=7", "mlmt.plan_only=true")
    recipe = _argv(f"recipes/{name}/run_{name}.sh", tmp_path, *extra)
    seed = _argv(SEED_SCRIPTS[name], tmp_path, *extra)
    assert recipe == seed
    assert recipe[:2] == ["-m", "verl.trainer.main_mlmt"] and recipe[-2:] == list(extra)  # overrides last: they win
    frozen = "mlmt.hl.freeze=true" if name == "fixed_feedback" else "mlmt.ll.freeze=true"
    assert frozen in recipe
