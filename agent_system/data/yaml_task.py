"""Tasks defined in YAML (the format of recurve, seed 003): load, validate, and convert to verl parquet rows.

A task file::

    main_prompt: "You are a helpful assistant."      # optional; prepended to every item's prompt
    items:                                            # required, non-empty
      - prompt: "Name the best programming language ..."
        answer: Rust                                  # a string (a number is converted with str())
    score_fn: |                                       # required: score_fn(text, answer) -> bool or a number in [0, 1]
      def score_fn(text, answer): ...
    done_fn: |                                        # optional: done_fn(text) -> bool, the episode ends
      def done_fn(text): ...
    split_fn: |                                       # optional: split_fn(output) -> bool, the utterance ends
      def split_fn(output): ...

The functions are user code: this module only parses them (:mod:`ast`, never executed here); they run in the project's
sandbox (:mod:`agent_system.rewards.yaml_reward`). Every problem is reported with the file, the item (0-based, as in
the ``items`` list) and the field; a syntax error also with its line in the file.

Rows (:func:`task_rows`) are self-contained: ``extra_info`` carries the function sources, so a parquet file can be
moved without its YAML file. Command line: ``python -m agent_system.data.preprocess --dataset yaml --input TASK.yaml
--output OUT.parquet``.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

import yaml

from agent_system.data.schema import make_row

DATA_SOURCE = "yaml_task"
FUNCTIONS = ("score_fn", "done_fn", "split_fn")  # score_fn is required, the other two optional
_ARITY = {"score_fn": 2, "done_fn": 1, "split_fn": 1}
_KNOWN_KEYS = {"main_prompt", "items", *FUNCTIONS}


class YamlTaskError(ValueError):
    """A bad task file; the message names the file, the item (when one is at fault) and the field."""

    def __init__(self, path: str, field: str, message: str, item: int | None = None) -> None:
        where = f"{path}: " + (f"item {item}: " if item is not None else "")
        super().__init__(f"{where}field {field!r}: {message}")
        self.path, self.field, self.item = path, field, item


@dataclass(frozen=True)
class YamlTask:
    """A validated task file.

    Attributes:
        path: The file's absolute path.
        main_prompt: Text prepended to every item's prompt ("" if absent).
        items: ``(prompt, answer)`` pairs.
        sources: Function name -> its Python source, for the functions the file defines (``score_fn`` always).
    """

    path: str
    main_prompt: str
    items: list[tuple[str, str]]
    sources: dict[str, str] = field(default_factory=dict)

    def prompt(self, index: int) -> str:
        """The full prompt of item ``index``: ``main_prompt``, a blank line, the item's prompt."""
        return join_prompt(self.main_prompt, self.items[index][0])


def join_prompt(main_prompt: str, prompt: str) -> str:
    """``main_prompt`` prepended to ``prompt`` (separated by a blank line; either may be empty)."""
    return "\n\n".join(part for part in (main_prompt.strip(), prompt.strip()) if part)


def check_function_source(source: object, name: str, path: str, line_offset: int = 0) -> str:
    """Checks that ``source`` is Python defining a top-level function ``name`` with the arity the format gives it.

    Nothing is executed. ``line_offset`` is added to syntax-error lines so they point into the YAML file.

    Raises:
        YamlTaskError: Not a string, a syntax error (with its line), or no such function.
    """
    if not isinstance(source, str) or not source.strip():
        raise YamlTaskError(path, name, "must be a non-empty string of Python source (use a YAML block: `|`)")
    try:
        tree = ast.parse(source, filename=f"<{name}>")
    except SyntaxError as error:
        line = (error.lineno or 0) + line_offset
        raise YamlTaskError(path, name, f"syntax error at line {line} of the file: {error.msg}") from None
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    if not functions:
        defined = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
        raise YamlTaskError(path, name, f"does not define a top-level function {name!r} (it defines {defined})")
    node = functions[-1]
    if isinstance(node, ast.AsyncFunctionDef):
        raise YamlTaskError(path, name, f"{name} must be a plain function, not async")
    args = node.args
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    arity = _ARITY[name]
    if required > arity or (positional < arity and args.vararg is None):
        raise YamlTaskError(path, name, f"{name} must accept {arity} positional argument(s)")
    return source


def _value_lines(path: str) -> dict[str, int]:
    """0-based line of each top-level key's value in the file (for syntax-error lines), from the YAML node tree."""
    with open(path, encoding="utf-8") as handle:
        node = yaml.compose(handle)
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            # a block scalar (`|`) starts on the line after its indicator
            offset = 1 if isinstance(value, yaml.ScalarNode) and value.style in ("|", ">") else 0
            lines[str(key.value)] = value.start_mark.line + offset
    return lines


def _answer(value: object, path: str, index: int) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise YamlTaskError(path, "answer", f"must be a string or a number, not {type(value).__name__}", index)
    text = str(value)
    if not text.strip():
        raise YamlTaskError(path, "answer", "is empty", index)
    return text


def load_task(path: str) -> YamlTask:
    """Reads and validates a task file.

    Raises:
        YamlTaskError: The first problem, naming the file, the item and the field.
        FileNotFoundError: No such file.
    """
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"task file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except yaml.YAMLError as error:
        raise YamlTaskError(path, "<yaml>", f"not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise YamlTaskError(path, "<yaml>", "the file must be a mapping with `items` and `score_fn`")
    unknown = sorted(set(map(str, data)) - _KNOWN_KEYS)
    if unknown:
        raise YamlTaskError(path, unknown[0], f"unknown key; the format has {sorted(_KNOWN_KEYS)}")
    main_prompt = data.get("main_prompt") or ""
    if not isinstance(main_prompt, str):
        raise YamlTaskError(path, "main_prompt", "must be a string")
    raw_items = data.get("items")
    if raw_items is None:
        raise YamlTaskError(path, "items", "is missing: a list of {prompt, answer}")
    if not isinstance(raw_items, list) or not raw_items:
        raise YamlTaskError(path, "items", "must be a non-empty list of {prompt, answer}")
    items = []
    for index, item in enumerate(raw_items):
        if not isinstance(item, dict):
            raise YamlTaskError(path, "items", "an item must be a mapping with `prompt` and `answer`", index)
        for key in ("prompt", "answer"):
            if key not in item or item[key] is None:
                raise YamlTaskError(path, key, "is missing", index)
        extra = sorted(set(map(str, item)) - {"prompt", "answer"})
        if extra:
            raise YamlTaskError(path, extra[0], "unknown key; an item has `prompt` and `answer`", index)
        if not isinstance(item["prompt"], str) or not join_prompt(main_prompt, item["prompt"]):
            raise YamlTaskError(path, "prompt", "must be a non-empty string", index)
        items.append((item["prompt"], _answer(item["answer"], path, index)))
    if "score_fn" not in data:
        raise YamlTaskError(path, "score_fn", "is missing: def score_fn(text, answer) -> bool or float")
    lines = _value_lines(path)
    sources = {
        name: check_function_source(data[name], name, path, lines.get(name, 0))
        for name in FUNCTIONS
        if data.get(name) is not None
    }
    return YamlTask(path, main_prompt, items, sources)


def task_rows(task: YamlTask, split: str = "train", limit: int | None = None) -> list[dict]:
    """verl rows of a task: ``data_source`` ``yaml_task``, prompt = main_prompt + item prompt, ground truth = answer.

    ``extra_info`` holds the function sources (``score_fn``, ``done_fn``, ``split_fn``; "" when absent), the task
    file's path and the item's index in it, so grading needs nothing but the row.
    """
    rows = []
    for index, (_, answer) in enumerate(task.items[:limit]):
        problem = task.prompt(index)
        extra = {
            "index": index,
            "split": split,
            "reference_solution": answer,
            "question": problem,
            "task_file": task.path,
            "item_index": index,
            **{name: task.sources.get(name, "") for name in FUNCTIONS},
        }
        rows.append(make_row(DATA_SOURCE, problem, "custom", answer, extra))
    return rows
