"""The uses of vLLM's API by this project and by verl's vLLM server, and a record of that API in a vLLM source tree (for
a version CI cannot install).

    python scripts/record_vllm_api.py SOURCE_DIR VERSION > requirements/vllm-VERSION-api.json

SOURCE_DIR holds the ``vllm/`` package: the ``.py`` files of the release's wheel (``unzip WHEEL 'vllm/*.py'
'vllm-*.dist-info/*'``) or its PyPI sdist. vLLM, verl and the project are only parsed (``ast``), never run or imported.

:func:`project_uses`: what the files under ``agent_system/`` use. :func:`verl_uses`: what verl's vLLM server uses, from
the installed verl's source: :data:`VERL_ENTRY` and the verl modules they import at module level (verl's lazy imports,
such as its quantisation and NPU patches, are left out). For each ``from vllm... import Name`` (and ``import
vllm.a.b``): the attributes read or called on the name or on what it returns (``engine = AsyncLLM.from_engine_args
(...)``, ``self.engine = engine``, then ``self.engine.sleep(level=1)``), and each call's keyword arguments (also the
keys of the dict passed as ``**name``: its dict literals, ``name["key"] =`` and ``name.setdefault("key", ...)``) and
positional count. Not seen: attributes of the objects vLLM hands back beyond that (``output.outputs[0].token_ids``),
argument types, behaviour.

:func:`engine_arg_uses`: the engine arguments that reach vLLM's command line through verl (``vllm serve`` options built
from a dict by ``build_cli_args_from_config``): the keys of that dict in verl's server, and every
``engine_kwargs.vllm.KEY`` the project sets (config files, scripts, docs). :func:`env_uses`: the ``VLLM_*`` names the
project and verl's server set or read.

:func:`record`: for each used name, where it is defined, its members (a class's fields, methods and class attributes
with those of its base classes defined in vLLM; a module's top-level names; for a module attribute declared with a
class annotation, ``current_platform: Platform``, that class's members) and the signatures of its callables (``""``:
calling the name itself; a class's is its ``__init__``, else its annotated fields); the engine arguments
(``EngineArgs``' fields, from which vLLM builds its command-line options) and the environment variables vLLM reads
(``vllm/envs.py``). :func:`mismatches` compares uses with a record: tests/unit/test_vllm_api_on_cpu.py runs it against
the committed record of the GPU install's vLLM.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# verl's vLLM rollout: the server process (engine, CLI, sleep and wake-up) and the worker-side adapter.
VERL_ENTRY = ("verl.workers.rollout.vllm_rollout.vllm_async_server", "verl.workers.rollout.vllm_rollout.vllm_rollout")
# Modules of that closure left out, each with why: what they call is not reached with vLLM 0.24.0 on the project's path.
VERL_LEFT_OUT = {
    "verl.utils.vllm.vllm_fp8_utils": "FP8 rollout quantization (rollout.quantization, never set by the project): its "
    "calls that vLLM 0.24.0 lacks (maybe_post_process_fp8_weight_block, make_fp8_moe_kernel(shared_experts=)) are in "
    "its vLLM < 0.20 patch, which build_fp8_method_patchers does not pick for 0.24.0",
}
# VLLM_* names verl sets that vLLM itself does not read, each with why.
ENV_LEFT_OUT = {
    "VLLM_ALL2ALL_BACKEND": "set for vllm-ascend on NPU only (VLLM_ASCEND_REQUIRED_ENV_VARS)",
    "VLLM_ASCEND_ENABLE_NZ": "set for vllm-ascend on NPU only (VLLM_ASCEND_REQUIRED_ENV_VARS)",
}
# verl's module that sets its Ray workers' environment (get_ppo_ray_runtime_env, which the project merges).
VERL_ENV_MODULES = ("verl.trainer.constants_ppo",)
# The project's files that may name engine arguments as `engine_kwargs.vllm.KEY` (configs, launchers, docs).
ENGINE_KWARG_FILES = ("agent_system/**/*.py", "mlmt-configs/**/*.yaml", "scripts/**/*.sh", "recipes/**/*", "docs/*.md")
SIGNATURE_NOTE = (
    "the parameters as Python writes them: '/' ends the positional-only, '*' or '*args' starts the keyword-only"
)


@dataclass(frozen=True)
class Call:
    """One call into vLLM: the name (``module:Name``), the member called (``""``: the name itself), the keywords passed
    (None: a ``**mapping`` whose keys are not known), the positional arguments (None: a ``*sequence``), where."""

    spec: str
    member: str
    keywords: frozenset[str] | None
    positional: int | None
    where: str


@dataclass
class Uses:
    """What some files use of vLLM: ``members`` maps ``module:Name`` to the attributes used on it; ``calls`` holds the
    calls, ``engine_args`` the engine-argument names with where each was seen, ``env`` the ``VLLM_*`` names."""

    members: dict[str, set[str]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    engine_args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)  # the specs some file imports without an ImportError fallback

    def add(self, node: ast.AST, imported: dict[str, str], tracked: dict, scope: ast.AST, where: str) -> None:
        """The use ``node`` makes of a vLLM name or of an instance ``tracked`` holds, if any."""
        line = getattr(node, "lineno", 0)

        def spec_of(owner: str) -> str | None:
            held = tracked.get(owner)
            return imported.get(owner) or (held[0] if held and held[1] <= line else None)

        if isinstance(node, ast.Attribute) and (spec := spec_of(ast.unparse(node.value))):
            self.members[spec].add(node.attr)
        if not isinstance(node, ast.Call):
            return
        callee = ast.unparse(node.func)
        if callee in imported:
            self.calls.append(_call(node, imported[callee], "", scope, where))
        elif isinstance(node.func, ast.Attribute) and (spec := spec_of(ast.unparse(node.func.value))):
            self.calls.append(_call(node, spec, node.func.attr, scope, where))

    def merge(self, other: Uses) -> Uses:
        for spec, members in other.members.items():
            self.members.setdefault(spec, set()).update(members)
        self.required |= other.required
        self.calls += other.calls
        self.engine_args = {**other.engine_args, **self.engine_args}
        self.env = {**other.env, **self.env}
        return self


# ---------------------------------------------------------------------------------------------- vLLM's definitions
def _statements(body: list[ast.stmt]):
    """A module's top-level statements, with those inside ``if`` (``TYPE_CHECKING``) and ``try`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _statements(node.body + node.orelse + getattr(node, "finalbody", []))


def signature(function: ast.FunctionDef | ast.AsyncFunctionDef, bound: bool) -> list[str]:
    """``function``'s parameters as :data:`SIGNATURE_NOTE` writes them, without the first when ``bound`` (a method
    called on its class or instance; a ``@staticmethod`` keeps it)."""
    arguments = function.args
    static = any(ast.unparse(d) == "staticmethod" for d in function.decorator_list)
    positional = [a.arg for a in arguments.posonlyargs + arguments.args][1 if bound and not static else 0 :]
    n_posonly = max(len(arguments.posonlyargs) - (1 if bound and not static else 0), 0)
    params = positional[:n_posonly] + (["/"] if n_posonly else []) + positional[n_posonly:]
    if arguments.vararg:
        params.append(f"*{arguments.vararg.arg}")
    elif arguments.kwonlyargs:
        params.append("*")
    params += [a.arg for a in arguments.kwonlyargs]
    return params + ([f"**{arguments.kwarg.arg}"] if arguments.kwarg else [])


class Source:
    """A vLLM source tree (the folder holding ``vllm/``), read with ``ast``."""

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

    def _classes(self, module: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """(module, class) of ``node`` and its base classes defined in vLLM, in method-resolution order (depth
        first)."""
        classes = [(module, node)]
        for base in node.bases:
            base = base.value if isinstance(base, ast.Subscript) else base  # Generic[T] -> Generic
            if isinstance(base, ast.Name):
                try:
                    where, found, kind = self.find(module, base.id)
                except (LookupError, FileNotFoundError):  # a base from another package
                    continue
                if kind == "class":
                    classes += [c for c in self._classes(where, found) if c not in classes]
        return classes

    def _outside_bases(self, module: str, node: ast.ClassDef) -> set[str]:
        """The attributes of ``node``'s base classes from other packages (``argparse.ArgumentParser``), read by
        importing those packages here (never vLLM); bases that do not import add nothing."""
        imports = {}  # local name -> (module, attribute or None)
        for item in _statements(self._module(module)[1].body):
            if isinstance(item, ast.ImportFrom) and item.module and not item.level:
                imports |= {alias.asname or alias.name: (item.module, alias.name) for alias in item.names}
            elif isinstance(item, ast.Import):
                imports |= {alias.asname or alias.name: (alias.name, None) for alias in item.names}
        names = set()
        for base in node.bases:
            base = ast.unparse(base.value if isinstance(base, ast.Subscript) else base)
            head, _, rest = base.partition(".")
            package, attribute = imports.get(head, (None, None))
            if package is None or package.split(".")[0] == "vllm":
                continue
            try:
                found = importlib.import_module(package)
                for part in [attribute, *rest.split(".")] if rest or attribute else []:
                    found = getattr(found, part) if part else found
            except (ImportError, AttributeError):
                continue
            names |= {name for name in dir(found) if not name.startswith("__")}
        return names

    def _target(self, module: str, node: ast.AST, kind: str) -> tuple[str, ast.AST, str]:
        """What an ``instance`` declaration (``current_platform: Platform``) is an instance of."""
        if kind != "instance":
            return module, node, kind
        return self._target(*self.find(module, ast.unparse(node.annotation).strip("'\"")))

    def members(self, module: str, node: ast.AST, kind: str) -> set[str]:
        module, node, kind = self._target(module, node, kind)
        if kind == "function":
            return set(signature(node, bound=False)) - {"/", "*"}
        names = set()
        for where, cls in [(module, node)] if kind == "module" else self._classes(module, node):
            for item in _statements(cls.body) if kind == "module" else cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign | ast.Assign):
                    targets = [item.target] if isinstance(item, ast.AnnAssign) else item.targets
                    names |= {target.id for target in targets if isinstance(target, ast.Name)}
                elif isinstance(item, ast.ImportFrom | ast.Import):
                    names |= {(alias.asname or alias.name).split(".")[0] for alias in item.names}
            if kind == "class":
                names |= _instance_attributes(cls) | self._outside_bases(where, cls)
        return names

    def signatures(self, module: str, node: ast.AST, kind: str) -> dict[str, list[str]]:
        """``{member: parameters}`` of a name's callables; ``""``: calling the name itself (an instance: none)."""
        instance = kind == "instance"
        module, node, kind = self._target(module, node, kind)
        if kind == "function":
            return {"": signature(node, bound=False)}
        if kind == "module":
            return {}
        found, fields = {}, []
        for _, cls in reversed(self._classes(module, node)):  # bases first, so a subclass's definition wins
            for item in cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[item.name] = signature(item, bound=True)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if "ClassVar" not in ast.unparse(item.annotation) and item.target.id not in fields:
                        fields.append(item.target.id)
        if not instance:  # the constructor: __init__, else the annotated fields (dataclass, msgspec, TypedDict)
            found[""] = found["__init__"] if "__init__" in found else fields
        return found


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """The ``self.name`` a class's methods assign (``self.engine_core = ...`` in ``__init__``)."""
    targets = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    targets.add(target.attr)
    return targets


def record(root: Path, version: str, specs, source_name: str = "") -> dict:
    """The record of ``specs`` (``module:Name``) in the vLLM source tree ``root``, with its engine arguments and
    environment variables."""
    source = Source(root)
    names, absent = {}, []
    for spec in sorted(specs):
        module, name = spec.split(":")
        try:
            where, node, kind = source.find(module, name)
        except (LookupError, FileNotFoundError):
            absent.append(spec)
            continue
        names[spec] = {
            "defined_in": f"{where}:{getattr(node, 'lineno', 1)}",
            "kind": kind,
            "members": sorted(source.members(where, node, kind)),
            "signatures": {k: ", ".join(v) for k, v in sorted(source.signatures(where, node, kind).items())},
        }
    return {
        "vllm": version,
        "source": source_name,
        "made_by": "python scripts/record_vllm_api.py SOURCE_DIR VERSION",
        "signature_format": SIGNATURE_NOTE,
        "engine_args": sorted(source.signatures(*source.find("vllm.engine.arg_utils", "EngineArgs"))[""]),
        "environment_variables": sorted(environment_variables(root)),
        "names": names,
        "absent": absent,
    }


def environment_variables(root: Path) -> set[str]:
    """The keys of ``environment_variables`` in ``vllm/envs.py``: every ``VLLM_*`` variable vLLM reads."""
    tree = ast.parse((root / "vllm" / "envs.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [None])[0]
        if getattr(target, "id", None) == "environment_variables" and isinstance(node.value, ast.Dict):
            return {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    raise LookupError(f"no environment_variables dict in {root / 'vllm' / 'envs.py'}")


# ------------------------------------------------------------------------------------------------------ the uses
def _imports(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Local name -> ``module:Name`` of every import from vLLM in ``tree`` (``import vllm.a.b``: ``vllm.a.b`` ->
    ``vllm.a:b``), and the specs imported outside a ``try`` that catches ``ImportError`` (the file's fallback)."""
    guarded = set()
    for node in ast.walk(tree):
        handlers = {ast.unparse(h.type) if h.type else "" for h in getattr(node, "handlers", [])}
        if isinstance(node, ast.Try) and handlers & {"ImportError", "ModuleNotFoundError", "Exception", ""}:
            guarded |= {id(n) for statement in node.body for n in ast.walk(statement)}
    imported, required = {}, set()
    for node in ast.walk(tree):
        specs = {}
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm" and not node.level:
            specs = {alias.asname or alias.name: f"{node.module}:{alias.name}" for alias in node.names}
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("vllm.") and not a.asname]
            specs = {name: "{}:{}".format(*name.rsplit(".", 1)) for name in names}
        imported |= specs
        required |= set() if id(node) in guarded else set(specs.values())
    return imported, required


def _owner(node: ast.expr) -> str:
    """The callee of ``x = Name(...)``, ``x = Name.factory(...)`` or ``x = await ...``, or ``node`` itself, as text."""
    node = node.value if isinstance(node, ast.Await) else node
    node = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(node.value if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) else node)


def _tracked(scope: ast.AST, imported: dict[str, str], known: dict) -> dict[str, tuple[str, int]]:
    """Source text of each target in ``scope`` that holds an instance of a vLLM class -> (the class's spec, the line
    from which it holds it): ``x = Class(...)``, ``x = Class.factory(...)``, and ``y = x`` of a target already known.
    What a function returns is not followed (its type is not known)."""
    tracked = dict(known)
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            owner, target = _owner(node.value), ast.unparse(node.targets[0])
            if isinstance(node.value, ast.Call | ast.Await) and owner in imported and owner[:1].isupper():
                tracked[target] = (imported[owner], node.lineno)
            elif owner in tracked and isinstance(node.value, ast.Name):
                tracked[target] = (tracked[owner][0], node.lineno)
    return tracked


def _dict_keys(function: ast.AST, name: str) -> set[str] | None:
    """The string keys ``**name`` passes, as far as ``function`` shows them: its dict literals assigned to ``name``,
    ``name["key"] = ...`` and ``name.setdefault("key", ...)``; None when ``name`` is not built in ``function``."""
    keys, built = set(), False
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == name:
            built = built or isinstance(node.value, ast.Dict)
            keys |= {k.value for d in ast.walk(node.value) if isinstance(d, ast.Dict) for k in d.keys if _text(k)}
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == name:
            keys |= {node.slice.value} if _text(node.slice) else set()
        if isinstance(node, ast.Call) and ast.unparse(node.func) == f"{name}.setdefault" and _text(node.args[0]):
            keys.add(node.args[0].value)
    return keys if built or keys else None


def _text(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _call(node: ast.Call, spec: str, member: str, scope: ast.AST, where: str) -> Call:
    keywords: set[str] | None = set()
    for keyword in node.keywords:
        expanded = {keyword.arg} if keyword.arg else _dict_keys(scope, ast.unparse(keyword.value))
        keywords = None if keywords is None or expanded is None else keywords | expanded
    starred = any(isinstance(a, ast.Starred) for a in node.args)
    return Call(
        spec, member, None if keywords is None else frozenset(keywords), None if starred else len(node.args), where
    )


def file_uses(path: Path, label: str) -> Uses:
    """What the file at ``path`` (named ``label`` in the uses) uses of vLLM."""
    text = path.read_text()
    if not re.search(r"^\s*(from|import) vllm", text, re.M):
        return Uses()
    tree = ast.parse(text)
    imported, required = _imports(tree)
    uses = Uses(members={spec: set() for spec in imported.values()}, required=required)
    in_class = {}  # method -> the `self.x` targets its class's methods assign (every method of it may read them)
    for cls in (c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)):
        methods = [m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
        attributes = {}
        for method in methods:
            found = _tracked(method, imported, {})
            attributes |= {k: (spec, 0) for k, (spec, _) in found.items() if k.startswith("self.")}
        in_class |= {method: attributes for method in methods}
    for scope in (f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)):
        tracked = _tracked(scope, imported, in_class.get(scope, {}))
        for node in ast.walk(scope):
            uses.add(node, imported, tracked, scope, f"{label}:{getattr(node, 'lineno', 0)}")
    return uses


def _sampling_keys(path: Path, label: str) -> list[Call]:
    """The project's ``generate(..., sampling_params=dict)`` calls: verl's server passes that dict to
    ``SamplingParams(**dict)``, so its keys are SamplingParams keywords."""
    text = path.read_text()
    if "sampling_params=" not in text:
        return []
    tree = ast.parse(text)
    calls = []
    for scope in (f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".generate"):
                for keyword in node.keywords:
                    if keyword.arg == "sampling_params" and (keys := _dict_keys(scope, ast.unparse(keyword.value))):
                        where = f"{label}:{node.lineno}"
                        calls.append(Call("vllm:SamplingParams", "", frozenset(keys), 0, where))
    return calls


def project_uses(repo: Path = REPO) -> Uses:
    """What ``agent_system/`` uses of vLLM, the engine arguments the project sets and the ``VLLM_*`` names it uses."""
    uses = Uses()
    for path in sorted((repo / "agent_system").rglob("*.py")):
        label = str(path.relative_to(repo))
        uses.merge(file_uses(path, label))
        uses.calls += _sampling_keys(path, label)
    uses.engine_args = engine_kwarg_uses(repo)
    uses.env = env_uses(sorted((repo / "agent_system").rglob("*.py")), repo)
    for pattern in ("scripts/**/*.sh", "mlmt-configs/**/*.yaml", "recipes/**/*.sh"):
        for path in sorted(repo.glob(pattern)):
            text = path.read_text(errors="replace")
            for match in re.finditer(r"\bVLLM_[A-Z0-9_]+\b", text):
                line = text.count("\n", 0, match.start()) + 1
                uses.env.setdefault(match.group(0), f"{path.relative_to(repo)}:{line}")
    return uses


def engine_kwarg_uses(repo: Path) -> dict[str, str]:
    """Every ``engine_kwargs.vllm.KEY`` the project names, and ``KEY:`` under ``engine_kwargs: vllm:`` in its YAML."""
    found = {}
    for pattern in ENGINE_KWARG_FILES:
        for path in sorted(p for p in repo.glob(pattern) if p.is_file()):
            text, label = path.read_text(errors="replace"), str(path.relative_to(repo))
            for match in re.finditer(r"engine_kwargs\.vllm\.([A-Za-z_][\w-]*)", text):
                found.setdefault(match.group(1), f"{label}:{text.count(chr(10), 0, match.start()) + 1}")
            if path.suffix == ".yaml":
                found = {**_yaml_vllm_keys(text, label), **found}
    return found


def _yaml_vllm_keys(text: str, label: str) -> dict[str, str]:
    """``KEY`` -> where, for each key of a ``vllm:`` block nested in an ``engine_kwargs:`` block of a YAML text."""
    found, stack = {}, []  # (indent, key) of the open blocks
    for number, line in enumerate(text.splitlines(), 1):
        match = re.match(r"^(\s*)([\w-]+):", line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if [k for _, k in stack[-2:]] == ["engine_kwargs", "vllm"]:
            found[match.group(2)] = f"{label}:{number}"
        stack.append((indent, match.group(2)))
    return found


def env_uses(paths: list[Path], root: Path) -> dict[str, str]:
    """Each ``VLLM_*`` string constant in ``paths`` -> where it first appears."""
    found = {}
    for path in paths:
        text = path.read_text()
        for node in ast.walk(ast.parse(text)) if "VLLM_" in text else ():
            if _text(node) and re.fullmatch(r"VLLM_[A-Z0-9_]+", node.value):
                found.setdefault(node.value, f"{path.relative_to(root)}:{node.lineno}")
    return found


def verl_files(site: Path) -> list[Path]:
    """:data:`VERL_ENTRY` and the verl modules they import at module level, transitively, under ``site``, less
    :data:`VERL_LEFT_OUT`."""
    seen, todo = {}, list(VERL_ENTRY)
    while todo:
        module = todo.pop()
        base = site / module.replace(".", "/")
        path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        if module in seen or not path.exists():
            continue
        seen[module] = path
        if module in VERL_LEFT_OUT:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("verl"):
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names if alias.name.startswith("verl")]
    return sorted(path for module, path in seen.items() if module not in VERL_LEFT_OUT)


def verl_uses(site: Path | None = None) -> Uses:
    """What verl's vLLM server uses of vLLM (from the installed verl's source, or the one under ``site``), with the
    engine arguments it puts on vLLM's command line and the ``VLLM_*`` names it uses."""
    site = site or Path(importlib.util.find_spec("verl").submodule_search_locations[0]).parent
    uses = Uses()
    files = verl_files(site)
    for path in files:
        label = str(path.relative_to(site))
        uses.merge(file_uses(path, label))
        uses.engine_args = {**uses.engine_args, **cli_arg_keys(path, label)}
    env_files = files + [site / f"{module.replace('.', '/')}.py" for module in VERL_ENV_MODULES]
    uses.env = {name: where for name, where in env_uses(env_files, site).items() if name not in ENV_LEFT_OUT}
    return uses


def cli_arg_keys(path: Path, label: str) -> dict[str, str]:
    """The keys of the dict a function in ``path`` passes to ``build_cli_args_from_config``: its dict literals (with
    those of the dicts merged into it with ``update``), ``["key"] =`` and ``setdefault``."""
    found = {}
    for scope in (
        f for f in ast.walk(ast.parse(path.read_text())) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
    ):
        for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
            if ast.unparse(call.func) != "build_cli_args_from_config" or not isinstance(call.args[0], ast.Name):
                continue
            names = {call.args[0].id}
            for node in ast.walk(scope):  # args.update(dp_args): dp_args's keys are args's
                if isinstance(node, ast.Call) and ast.unparse(node.func) in {f"{n}.update" for n in names}:
                    names |= {a.id for a in node.args if isinstance(a, ast.Name)}
                    update = {k.value for a in node.args if isinstance(a, ast.Dict) for k in a.keys if _text(k)}
                    found |= {key: f"{label}:{node.lineno}" for key in update}
            for name in names:
                found |= {key: f"{label}:{call.lineno}" for key in _dict_keys(scope, name) or ()}
    return found


# ------------------------------------------------------------------------------------------------- the comparison
def _accepts(params: list[str], call: Call) -> list[str]:
    """What of ``call`` a callable with ``params`` (:data:`SIGNATURE_NOTE`) does not take."""
    posonly = params[: params.index("/")] if "/" in params else []
    star = next((i for i, p in enumerate(params) if p.startswith("*") and not p.startswith("**")), len(params))
    positional = [p for p in params[:star] if p != "/"]
    keyword_ok = {p for p in params if not p.startswith("*") and p != "/"} - set(posonly)
    problems = []
    if call.keywords is not None and not any(p.startswith("**") for p in params):
        problems += [f"{k}=" for k in sorted(call.keywords - keyword_ok)]
    varargs = star < len(params) and params[star] != "*"
    if call.positional is not None and call.positional > len(positional) and not varargs:
        problems.append(f"{call.positional} positional arguments (takes {len(positional)})")
    return problems


def mismatches(recorded: dict, uses: Uses) -> list[str]:
    """Each use the record does not allow, one line each: a name or member it lacks, a keyword or positional argument
    the callee does not take, an engine argument or environment variable vLLM does not know."""
    names, version = recorded["names"], recorded["vllm"]
    found = []
    for spec, members in sorted(uses.members.items()):
        if spec not in names:
            found += [f"{spec}: not in vLLM {version} (or not recorded)"] if spec in uses.required else []
        elif absent := sorted(members - set(names[spec]["members"])):
            found.append(f"{spec}: vLLM {version} has no {', '.join(absent)}")
    for call in uses.calls:
        params = names.get(call.spec, {}).get("signatures", {}).get(call.member)
        if params is not None and (problems := _accepts([p for p in params.split(", ") if p], call)):
            callee = call.spec.split(":")[1] + (f".{call.member}" if call.member else "")
            found.append(f"{call.where}: {callee}({', '.join(problems)}): vLLM {version} takes ({params})")
    engine_args = set(recorded["engine_args"])
    for key, where in sorted(uses.engine_args.items()):
        if key.replace("-", "_") not in engine_args:
            found.append(f"{where}: engine argument {key!r} is not an engine argument of vLLM {version}")
    for name, where in sorted(uses.env.items()):
        if name not in recorded["environment_variables"]:
            found.append(f"{where}: {name} is not an environment variable vLLM {version} reads")
    return found


def all_uses(repo: Path = REPO) -> Uses:
    """The project's uses and verl's vLLM server's together."""
    return project_uses(repo).merge(verl_uses())


if __name__ == "__main__":
    root, version = sys.argv[1:]
    wheel = sorted(Path(root).glob("vllm-*.dist-info"))
    made_from = wheel[0].name.removesuffix(".dist-info") + " wheel" if wheel else "source tree"
    json.dump(record(Path(root), version, all_uses().members, made_from), sys.stdout, indent=1)
    sys.stdout.write("\n")
