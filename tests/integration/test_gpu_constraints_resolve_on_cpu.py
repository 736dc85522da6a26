"""The GPU install resolves, for each supported Python, to exactly the pins of its constraints file.

For each of Python 3.10, 3.11 and 3.12 and each GPU set (`.[gpu]` with requirements/constraints-gpu.txt, verl's
tested stack; `.[gpu-torch213]` with requirements/constraints-gpu-torch213.txt), `uv pip compile setup.py --extra X
-c FILE` resolves the install the README gives for Linux x86_64, from PyPI's wheel metadata only (nothing is
downloaded or installed; ~10 s per case with a warm uv cache). The test fails when a set does not resolve, or when
the resolution holds a package the file does not pin for that Python or at another version (the file is stale: run
`bash scripts/compile_gpu_constraints.sh`). It needs PyPI and skips, saying so, only when PyPI cannot be reached.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from script_modules import load_script

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.slow(seconds=60)]

REPO = Path(__file__).resolve().parents[2]
SETS = {"gpu": "constraints-gpu.txt", "gpu-torch213": "constraints-gpu-torch213.txt"}
PYTHONS = ("3.10", "3.11", "3.12")
PYPI = "https://pypi.org/simple/"

gpu_bundle = load_script("gpu_bundle")


@pytest.fixture(scope="module")
def uv() -> str:
    try:
        urllib.request.urlopen(PYPI, timeout=15).close()
    except OSError as error:
        pytest.skip(f"PyPI ({PYPI}) cannot be reached ({error}): the GPU constraints' resolution is not checked")
    path = Path(sys.executable).parent / "uv"
    assert path.exists(), f"{path} is missing: scripts/install.sh installs uv into the venv"
    return str(path)


def _pins_for(constraints: Path, python: str) -> dict[str, str]:
    """The file's exact pins that apply on Linux x86_64 under this Python (its markers evaluated, as the bundle's)."""
    pins = {}
    for pin in gpu_bundle.select_pins(constraints.read_text().splitlines(), python):
        requirement = Requirement(pin)
        pins[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return pins


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("extra", SETS)
def test_gpu_set_resolves_to_its_pins(uv, extra, python):
    constraints = REPO / "requirements" / SETS[extra]
    command = [
        uv, "pip", "compile", "setup.py", "--extra", extra, "-c", str(constraints), "--python-version", python,
        "--python-platform", "x86_64-manylinux_2_28", "--no-config", "--no-python-downloads", "--no-header",
        "--no-annotate", "--quiet",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f".[{extra}] with {constraints.name} does not resolve on Python {python}:\n" + (result.stderr[-3000:])
    )
    resolved = {}
    for line in result.stdout.splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            resolved[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
    pins = _pins_for(constraints, python)
    unpinned = sorted(name for name in resolved if name not in pins)
    assert not unpinned, f"{constraints.name} pins no version of {unpinned} for Python {python}: re-compile it"
    assert {"verl", "torch", "vllm"} <= resolved.keys()  # the extra was applied
