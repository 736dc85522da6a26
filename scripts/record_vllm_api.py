"""The project's own uses of vLLM's API, and a record of them in a vLLM source tree (for a version CI cannot install).

    python scripts/record_vllm_api.py SOURCE_DIR VERSION > requirements/vllm-VERSION-api.json

SOURCE_DIR holds the ``vllm/`` package (the PyPI sdist unpacked: ``vllm-0.24.0.tar.gz`` is 36 MB where the wheel is
266 MB). Both the project and vLLM are only parsed (``ast``), never run.

:func:`project_uses`: every ``from vllm... import Name`` in ``agent_system/``, with what the importing file uses of
each name: the keyword arguments of calls to it (also the keys of a dict literal passed as ``**name``) and the
attributes read or set on it or on what it returns (``engine = AsyncLLM.from_engine_args(...)``, then
``engine.generate``). Not seen: attributes of the objects vLLM hands back (``output.outputs[0].token_ids``), argument
types, behaviour.

:func:`record`: for each used name, where it is defined and its members: a class's fields, methods and class
attributes with those of its base classes defined in vLLM (bases from other packages, such as ``msgspec.Struct``, add
nothing); a function's parameters; for a module attribute declared with a class annotation
(``current_platform: Platform``), that class's members. tests/unit/test_vllm_api_on_cpu.py compares the uses with the
installed vLLM's source and with the committed record of the GPU install's vLLM.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path


def _statements(body: list[ast.stmt]):
    """A module's top-level statements, with those inside ``if`` (``TYPE_CHECKING``) and ``try`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _statements(node.body + node.orelse + getattr(node, "finalbody", []))


class Source:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _module(self, module: str) -> tuple[Path, ast.Module]:
        base = self.root / module.replace(".", "/")
        path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        return path, ast.parse(path.read_text())

    def find(self, module: str, name: str) -> tuple[str, ast.AST, str]:
        """(module, definition, kind) of ``module.name``, following imports and lazy ``MODULE_ATTRS`` re-exports."""
        path, tree = self._module(module)
        statements = list(_statements(tree.body))
        for node in statements:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return module, node, "class" if isinstance(node, ast.ClassDef) else "function"
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
                return module, node, "instance"
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in statements:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = node.module or ""
                        if node.level:
                            source = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [source])
                        return self.find(source.rstrip("."), alias.name)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):  # MODULE_ATTRS = {name: ".x:y"}
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Constant):
                        target, _, attribute = value.value.partition(":")
                        return self.find(package + target if target.startswith(".") else target, attribute)
        if (self.root / module.replace(".", "/") / name).exists() or (path.parent / f"{name}.py").exists():
            submodule = f"{module}.{name}"
            return submodule, self._module(submodule)[1], "module"
        raise LookupError(f"{module}:{name} is not defined in {path}")

    def members(self, module: str, node: ast.AST, kind: str) -> set[str]:
        if kind == "function":
            arguments = node.args
            names = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
            return names | {f"*{a.arg}" for a in (arguments.vararg, arguments.kwarg) if a}
        if kind == "instance":
            return self.members(*self.find(module, ast.unparse(node.annotation).strip("'\"")))
        names = set()
        for item in _statements(node.body) if kind == "module" else node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(item.name)
            elif isinstance(item, ast.AnnAssign | ast.Assign):
                targets = [item.target] if isinstance(item, ast.AnnAssign) else item.targets
                names |= {target.id for target in targets if isinstance(target, ast.Name)}
            elif isinstance(item, ast.ImportFrom | ast.Import):
                names |= {(alias.asname or alias.name).split(".")[0] for alias in item.names}
        if kind == "module":
            return names
        for base in node.bases:
            base = base.value if isinstance(base, ast.Subscript) else base  # Generic[T] -> Generic
            if isinstance(base, ast.Name):
                try:
                    names |= self.members(*self.find(module, base.id))
                except (LookupError, FileNotFoundError):  # a base from another package
                    pass
        return names


def project_uses(package: Path) -> dict[str, set[str]]:
    """``{"module:name": {member, ...}}`` of every name the files under ``package`` import from vLLM."""
    uses: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {}  # local name -> spec
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                for alias in node.names:
                    imported[alias.asname or alias.name] = f"{node.module}:{alias.name}"
                    uses.setdefault(imported[alias.asname or alias.name], set())
        if not imported:
            continue
        classes = {}  # method -> the `self.x = Name(...)` targets of its class, which every method of it may read
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef):
                attributes = {k: v for k, v in _returned(cls, imported).items() if k.startswith("self.")}
                functions = [m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
                classes.update({method: attributes for method in functions})
        for scope in ast.walk(tree):  # in each function: what its calls and attribute reads use
            if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            returned = _returned(scope, imported) | classes.get(scope, {})
            for node in ast.walk(scope):
                if isinstance(node, ast.Attribute):
                    owner = ast.unparse(node.value)
                    spec = imported.get(owner) or returned.get(owner)
                    if spec:
                        uses[spec].add(node.attr)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported:
                    for keyword in node.keywords:
                        names = {keyword.arg} if keyword.arg else _dict_keys(scope, ast.unparse(keyword.value))
                        uses[imported[node.func.id]].update(names)
    return uses


def _returned(scope: ast.AST, imported: dict[str, str]) -> dict[str, str]:
    """``target = Name(...)`` or ``target = Name.factory(...)`` in ``scope``: target (source text) -> Name's spec."""
    returned = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value.func
            owner = call.value if isinstance(call, ast.Attribute) else call
            if isinstance(owner, ast.Name) and owner.id in imported:
                returned[ast.unparse(node.targets[0])] = imported[owner.id]
    return returned


def _dict_keys(function: ast.AST, name: str) -> set[str]:
    """The string keys of the dict literals assigned to ``name`` in ``function`` (what ``**name`` passes)."""
    values = [n.value for n in ast.walk(function) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name]
    dicts = [d for value in values for d in ast.walk(value) if isinstance(d, ast.Dict)]
    return {key.value for d in dicts for key in d.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}


def record(root: Path, version: str, specs) -> dict:
    source = Source(root)
    names = {}
    for spec in sorted(specs):
        module, name = spec.split(":")
        where, node, kind = source.find(module, name)
        names[spec] = {
            "defined_in": f"{where}:{getattr(node, 'lineno', 1)}",
            "kind": kind,
            "members": sorted(source.members(where, node, kind)),
        }
    return {"vllm": version, "made_by": "python scripts/record_vllm_api.py SOURCE_DIR VERSION", "names": names}


if __name__ == "__main__":
    root, version = sys.argv[1:]
    uses = project_uses(Path(__file__).resolve().parents[1] / "agent_system")
    json.dump(record(Path(root), version, uses), sys.stdout, indent=1)
    print()
