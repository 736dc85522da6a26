"""The package's layering rules, read from the code's own imports (every ``import`` statement of agent_system/, those
inside functions included, and ``importlib.import_module("agent_system...")`` calls):

* verl_compat (the seam to verl), multi_turn_rollout, prompts, rewards and data import neither the trainer nor the
  CPU backend;
* eval does not import the trainer;
* the trainer does not import the CPU backend (the loop is the same on every device);
* no two modules import each other, directly or through others.

And ``import agent_system.rewards`` in a fresh interpreter loads no trainer or CPU-backend module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "agent_system"

LOWER = ("agent_system.verl_compat", "agent_system.multi_turn_rollout", "agent_system.prompts", "agent_system.rewards")
LOWER += ("agent_system.data",)
CONFIG = ("agent_system.config", "agent_system.verl_keys")  # the bottom layer the rooms above read
LEVELS, LOOP, LAUNCHER = "agent_system.levels", "agent_system.trainer", "agent_system.launcher"
METHODS, CPU_BACKEND = "agent_system.methods", "agent_system.cpu_backend"
ABOVE_CONFIG = (LEVELS, LOOP, LAUNCHER, METHODS)
RULES = [
    *((lower, forbidden) for lower in LOWER for forbidden in (*CONFIG, *ABOVE_CONFIG, CPU_BACKEND)),
    *((config, forbidden) for config in CONFIG for forbidden in ABOVE_CONFIG),
    *((LEVELS, forbidden) for forbidden in (LOOP, LAUNCHER, METHODS)),
    *((LOOP, forbidden) for forbidden in (LAUNCHER, METHODS)),
    (METHODS, LAUNCHER),
    *(("agent_system.eval", forbidden) for forbidden in (LEVELS, LOOP, LAUNCHER)),
    *((room, CPU_BACKEND) for room in (*CONFIG, LEVELS, LOOP, LAUNCHER, METHODS)),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported agent_system module, line) for every import in the file, wherever it stands."""
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def add(name: str, line: int) -> None:
        # A dotted name that is not a module (an attribute of one) counts as its nearest enclosing module.
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != this:
            found.append((name, line))

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _within(alias.name, "agent_system"):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if not _within(base, "agent_system"):
                continue
            for alias in node.names:
                # ``from agent_system.trainer import advantages`` imports the submodule when there is one.
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _within(node.args[0].value, "agent_system")
        ):
            add(node.args[0].value, node.lineno)
    return found


def import_graph() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def rule_breaks(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    breaks = []
    for source, targets in graph.items():
        for target, line in targets:
            for lower, forbidden in RULES:
                if _within(source, lower) and _within(target, forbidden):
                    breaks.append(f"{graph_path(source)}:{line} imports {target} ({lower} must not import {forbidden})")
    return breaks


def graph_path(module: str) -> str:
    return str(_modules()[module].relative_to(REPO))


def import_cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_scanner_sees_lazy_relative_and_importlib_imports(tmp_path):
    modules = {"agent_system.launcher": Path("t"), "agent_system.launcher.main": Path("m"), "agent_system.x": Path("x")}
    source = tmp_path / "agent_system" / "x.py"
    source.parent.mkdir()
    source.write_text(
        "def f():\n    from agent_system.launcher import main\n"
        "def g():\n    from .launcher.main import thing\n"
        "importlib.import_module('agent_system.launcher.main')\n"
    )
    global REPO
    repo, REPO = REPO, tmp_path
    try:
        found = imports_of(source, modules)
    finally:
        REPO = repo
    assert found == [("agent_system.launcher.main", line) for line in (2, 4, 5)]


def test_the_rules_and_the_cycle_search_catch_a_break():
    graph = {
        "agent_system.rewards.pool": [("agent_system.config", 3)],
        "agent_system.config": [("agent_system.rewards.pool", 7)],
    }
    assert import_cycles(graph) == [["agent_system.config", "agent_system.rewards.pool"]]
    assert rule_breaks(graph) == [
        "agent_system/rewards/pool.py:3 imports agent_system.config (agent_system.rewards must not import "
        "agent_system.config)"
    ]


def test_no_import_breaks_the_layering():
    breaks = rule_breaks(import_graph())
    assert not breaks, "imports against the layering rules:\n" + "\n".join(breaks)


def test_no_import_circle():
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


@pytest.mark.external
@pytest.mark.parametrize("module", ["agent_system.rewards", "agent_system.multi_turn_rollout.episode"])
def test_importing_a_lower_layer_loads_no_trainer_code(module):
    layers = ("agent_system.trainer", "agent_system.cpu_backend")
    probe = f"import sys, {module}; print('\\n'.join(m for m in sys.modules if m.startswith({layers!r})))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"import {module} loaded: {result.stdout.split()}"
