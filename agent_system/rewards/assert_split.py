"""Splits a test assert into what the candidate program computes (run in the sandbox) and what the grader checks here.

A reward a policy cannot game must not let the program see, or take part in, the comparison with the expected value.
For ``assert EXPR`` this module finds the *holes*: the smallest sub-expressions that use the program's own names
(``add(1, 2)`` in ``assert add(1, 2) == 3``; ``similar_elements(...)`` in ``assert set(similar_elements(...)) ==
set((4, 5))``). Only the holes' source goes to the sandbox (:mod:`agent_system.rewards.sandbox_harness`), which
evaluates each one and sends back its value as plain data (exact builtin types, :func:`decode_value`). The rest of the
assert, the expected side included, is evaluated here, in the trusted process, by a small evaluator over the syntax
tree (:func:`evaluate`): constants, containers, comparisons, ``and`` / ``or`` / ``not``, arithmetic on the expected
side, and a fixed set of trusted functions (``set``, ``sorted``, ``math.isclose``, ``sys.getsizeof``, ...; the real
ones, whatever the program did to ``builtins`` or ``math`` in its own process).

Which side is the program's: the operands of a comparison (and the arguments of a trusted call such as
``math.isclose``) that use a name which is not a trusted function are candidate sides; when none does (``assert
sum(10, 15) == 6``, where the program defines ``sum``), the left operand is. On a candidate side, a trusted function
name that the program itself defines at top level (``def sum``) is the program's, and a call of it is a hole. On
the other sides trusted names always mean the real functions, so the expected values never become holes. (A name is
the program's when it is neither a builtin nor ``math`` / ``sys``: ``add``, or ``root`` from the setup code.) A test
that is not one ``assert`` statement, or whose expected side this evaluator cannot evaluate, is not split: it runs
whole in the sandbox, as before (:attr:`Split.whole`), and can be gamed; docs/CODE_REWARD.md lists the counts in MBPP.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
import sys
from dataclasses import dataclass, field

HOLE_PREFIX = "__mlmt_hole_"
MAX_DEPTH = 100  # nesting of a returned value (a deeper or cyclic value is unverifiable)
MAX_PROGRAM_CHARS = 100_000  # a longer program is not parsed nor run (MBPP's longest reference: 1,331)

# trusted functions: name -> the real function (evaluated here, on plain data)
TRUSTED_NAMES = {
    "set": set,
    "frozenset": frozenset,
    "sorted": sorted,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "abs": abs,
    "round": round,
    "len": len,
    "min": min,
    "max": max,
    "sum": sum,
}
CONVERTERS = ("list", "tuple", "set", "frozenset", "sorted")  # may be applied in the sandbox to a non-plain value
TRUSTED_ATTRIBUTES = {("math", "isclose"): math.isclose, ("sys", "getsizeof"): sys.getsizeof}
_TRUSTED_MODULES = {module for module, _ in TRUSTED_ATTRIBUTES}
_BUILTIN_NAMES = set(dir(builtins))
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
# arithmetic only between expected-side values (a hole is never an operand here: no huge products of model output)
_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


class NotTrusted(ValueError):
    """The expression has a part the trusted evaluator does not handle."""


class Unverifiable(ValueError):
    """A value sent back by the sandbox that is not plain data."""


@dataclass(frozen=True)
class Converted:
    """A hole's value that the sandbox passed through the converter around it (``set(<generator>)``)."""

    value: object


@dataclass
class Split:
    """One test, split. ``check`` is the assert's expression with each hole replaced by the name ``__mlmt_hole_<k>``;
    ``holes`` are the holes' source texts (sent to the sandbox); ``left`` is the expression of the assert's left
    operand, when it is a comparison (for the failure message). ``whole`` is True when the test cannot be split."""

    test: str
    check: ast.expr | None = None
    holes: list[str] = field(default_factory=list)
    wrappers: list[str] = field(default_factory=list)  # per hole: the converter call around it ("set"), or ""
    left: ast.expr | None = None
    whole: bool = False


class UnparsableProgram(ValueError):
    """The program is too large, or nested too deeply, for the parser (it could not be compiled in the sandbox
    either); the reason is the exception's text."""


def defined_names(*sources: str) -> set[str]:
    """Names bound at top level by the program (and the setup code): functions, classes, assignments, imports.

    Raises:
        UnparsableProgram: a source is longer than :data:`MAX_PROGRAM_CHARS` or nested too deeply for the parser (its
            ``RecursionError`` at about 3,000 levels, its ``MemoryError`` at about 6,000). A syntax error is not one:
            the sandbox reports it, as Python does.
    """
    names: set[str] = set()
    for source in sources:
        if len(source or "") > MAX_PROGRAM_CHARS:
            raise UnparsableProgram(f"the program is longer than {MAX_PROGRAM_CHARS:,} characters")
        try:
            tree = ast.parse(source or "")
        except (SyntaxError, ValueError):
            continue
        except (RecursionError, MemoryError) as exc:  # the parser's own depth limits, not the machine's memory
            raise UnparsableProgram(f"the program is nested too deeply to parse ({type(exc).__name__})") from None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            else:
                for child in ast.walk(node):
                    if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                        names.add(child.id)
    return names


def _trusted_function(func: ast.expr, own: set[str]):
    """The real function a call's ``func`` names, or None (the program's function, or not a trusted one)."""
    if isinstance(func, ast.Name) and func.id in TRUSTED_NAMES and func.id not in own:
        return TRUSTED_NAMES[func.id]
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return TRUSTED_ATTRIBUTES.get((func.value.id, func.attr))
    return None


def _uses_program(node: ast.AST) -> bool:
    """True when ``node`` uses a name that is neither a builtin nor a trusted module (nor bound inside ``node``, as a
    comprehension's variable is): a name the program or the setup code defines (``add``, ``root``)."""
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {
        a.arg for n in ast.walk(node) if isinstance(n, ast.Lambda) for a in ast.walk(n.args) if isinstance(a, ast.arg)
    }
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and child.id not in bound:
            if (
                child.id not in _BUILTIN_NAMES
                and child.id not in _TRUSTED_MODULES
                and not child.id.startswith(HOLE_PREFIX)
            ):
                return True
    return False


def _is_trusted(node: ast.AST, own: set[str]) -> bool:
    """True when the evaluator here can evaluate ``node`` with no hole."""
    try:
        _check(node, own)
    except NotTrusted:
        return False
    return True


def _check(node: ast.AST, own: set[str]) -> None:
    if isinstance(node, ast.Constant):
        return
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            _check(element, own)
        return
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise NotTrusted("dict unpacking")
        for child in [*node.keys, *node.values]:
            _check(child, own)
        return
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(node.operand, own)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        _check(node.left, own)
        return _check(node.right, own)
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, own)
        return
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        for child in [node.left, *node.comparators]:
            _check(child, own)
        return
    if isinstance(node, ast.Call) and _trusted_function(node.func, own) is not None:
        for child in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(child, ast.Starred):
                raise NotTrusted("starred argument")
            _check(child, own)
        if any(k.arg is None for k in node.keywords):
            raise NotTrusted("keyword unpacking")
        return
    if isinstance(node, ast.Name) and node.id.startswith(HOLE_PREFIX):
        return
    raise NotTrusted(type(node).__name__)


class _Splitter:
    def __init__(self, source: str, own: set[str]) -> None:
        self.source, self.own, self.holes, self.wrappers = source, own, [], []

    def hole(self, node: ast.expr, wrapper: str = "") -> ast.expr:
        text = ast.get_source_segment(self.source, node) or ast.unparse(node)
        self.holes.append(text)
        self.wrappers.append(wrapper)
        return ast.copy_location(ast.Name(id=f"{HOLE_PREFIX}{len(self.holes) - 1}", ctx=ast.Load()), node)

    def expected(self, node: ast.expr) -> ast.expr:
        """An expected side: trusted names are the real functions; anything else cannot be split."""
        if not _is_trusted(node, set()):
            raise NotTrusted(ast.unparse(node))
        return node

    def candidate(self, node: ast.expr) -> ast.expr:
        """A candidate side: trusted structure stays here, each part that uses the program becomes a hole."""
        if not _uses_program(node) and _is_trusted(node, self.own):
            return node
        if isinstance(node, ast.Compare | ast.BoolOp) or (isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY):
            return self.assertion(node)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return type(node)(elts=[self.candidate(e) for e in node.elts], ctx=ast.Load())
        if isinstance(node, ast.Call) and _trusted_function(node.func, self.own) is not None:
            if not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords):
                count = len(self.holes)
                try:
                    return self.call(node)
                except NotTrusted:  # e.g. sorted(f(x), key=len): the program's side as a whole
                    del self.holes[count:], self.wrappers[count:]
        return self.hole(node)

    def operands(self, nodes: list[ast.expr]) -> list[ast.expr]:
        """The operands of a comparison or a trusted call: those that use the program are candidate sides (the first
        one when none does), the others expected sides."""
        uses = [_uses_program(n) for n in nodes]
        if not any(uses):
            uses[0] = True
        return [self.candidate(n) if use else self.expected(n) for n, use in zip(nodes, uses, strict=True)]

    def call(self, node: ast.Call) -> ast.expr:
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        if name in CONVERTERS and len(node.args) == 1 and not node.keywords and _uses_program(node.args[0]):
            if not (isinstance(node.args[0], ast.Call) and _trusted_function(node.args[0].func, self.own)):
                return ast.Call(func=node.func, args=[self.hole(node.args[0], name)], keywords=[])
        values = self.operands([*node.args, *(k.value for k in node.keywords)])
        keywords = [
            ast.keyword(arg=k.arg, value=v) for k, v in zip(node.keywords, values[len(node.args) :], strict=True)
        ]
        return ast.Call(func=node.func, args=values[: len(node.args)], keywords=keywords)

    def assertion(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(op=node.op, values=[self.assertion(v) for v in node.values])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ast.UnaryOp(op=node.op, operand=self.assertion(node.operand))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            values = self.operands([node.left, *node.comparators])
            return ast.Compare(left=values[0], ops=node.ops, comparators=values[1:])
        checked = self.candidate(node)
        if isinstance(checked, ast.Name) and checked.id == f"{HOLE_PREFIX}{len(self.holes) - 1}":
            self.wrappers[-1] = "bool"  # only its truth value is tested
        return checked


def split_test(test: str, own: set[str]) -> Split:
    """Splits one test statement (see the module docstring); ``own`` are the program's top-level names."""
    source = test.strip()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Split(test, whole=True)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return Split(test, whole=True)
    # an assert's message (``assert f(x) == 1, 2``) only matters once it fails: it is neither sent nor evaluated
    expression = tree.body[0].test
    splitter = _Splitter(source, own)
    try:
        check = splitter.assertion(expression)
        _check(check, set())  # what is left (holes aside) uses only the real trusted functions
    except NotTrusted:
        return Split(test, whole=True)
    left = check.left if isinstance(check, ast.Compare) else None
    return Split(test, check, splitter.holes, splitter.wrappers, left)


def evaluate(node: ast.AST, holes: dict[str, object]):
    """Evaluates a split expression here: ``holes`` maps ``__mlmt_hole_<k>`` to the value the sandbox sent back."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = holes[node.id]
        return value.value if isinstance(value, Converted) else value
    if isinstance(node, ast.Tuple):
        return tuple(evaluate(e, holes) for e in node.elts)
    if isinstance(node, ast.List):
        return [evaluate(e, holes) for e in node.elts]
    if isinstance(node, ast.Set):
        return {evaluate(e, holes) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {evaluate(k, holes): evaluate(v, holes) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](evaluate(node.operand, holes))
    if isinstance(node, ast.BinOp):
        return _ARITHMETIC[type(node.op)](evaluate(node.left, holes), evaluate(node.right, holes))
    if isinstance(node, ast.BoolOp):
        value = None
        for child in node.values:
            value = evaluate(child, holes)
            if bool(value) is isinstance(node.op, ast.Or):
                return value
        return value
    if isinstance(node, ast.Compare):
        left = evaluate(node.left, holes)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = evaluate(comparator, holes)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        if len(node.args) == 1 and isinstance(node.args[0], ast.Name):
            value = holes[node.args[0].id]
            if isinstance(value, Converted):  # the sandbox applied this converter already
                return value.value
        function = _trusted_function(node.func, set())  # a call the program defines was made a hole
        args = [evaluate(a, holes) for a in node.args]
        return function(*args, **{k.arg: evaluate(k.value, holes) for k in node.keywords})
    raise NotTrusted(type(node).__name__)


def decode_value(encoded, depth: int = 0):
    """The plain value the harness encoded (``sandbox_harness._encode``); raises :class:`Unverifiable` on anything
    else. Tags: ``n`` None, ``b`` bool, ``i`` int (hex), ``f`` float (float.hex), ``c`` complex, ``s`` str, ``y``
    bytes (hex), ``l`` list, ``t`` tuple, ``d`` dict (pairs), ``S`` set, ``F`` frozenset."""
    if depth > MAX_DEPTH:
        raise Unverifiable("nested too deeply")
    if not isinstance(encoded, list) or not encoded or not isinstance(encoded[0], str):
        raise Unverifiable("malformed value")
    tag, body = encoded[0], encoded[1:]
    try:
        if tag == "n" and not body:
            return None
        (item,) = body
        if tag == "b" and type(item) is bool:
            return item
        if tag == "i" and type(item) is str:
            return int(item, 16)
        if tag == "f" and type(item) is str:
            return float.fromhex(item)
        if tag == "c" and type(item) is list and len(item) == 2:
            return complex(float.fromhex(item[0]), float.fromhex(item[1]))
        if tag == "s" and type(item) is str:
            return item
        if tag == "y" and type(item) is str:
            return bytes.fromhex(item)
        if tag in "ltSF" and len(tag) == 1 and type(item) is list:
            values = [decode_value(v, depth + 1) for v in item]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](values)
        if tag == "d" and type(item) is list:
            return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in item}
    except (ValueError, TypeError, OverflowError) as exc:
        raise Unverifiable(f"malformed value ({exc})") from None
    raise Unverifiable(f"malformed value (tag {tag!r})")
