"""``--help``, ``--help-all`` and ``--cfg job`` of ``python -m verl.trainer.main_mlmt``, for the machine they run on.

    python -m verl.trainer.main_mlmt --help [key=value ...]       # the mlmt.* keys with their comments, verl's folded
    python -m verl.trainer.main_mlmt --help-all [key=value ...]   # the same header, then the whole config
    python -m verl.trainer.main_mlmt --cfg job [--resolve] [key=value ...]   # the whole config (Hydra's flag)

Each shows the config the run would get here: composed with the overrides given and, on the CPU backend, the CPU
overlay applied under them (:func:`agent_system.config.compose_config`). Hydra's own ``--help`` and ``--cfg job``
print the config before the overlay, and ``--help`` prints all of verl's ~1,800 lines. The comments are those of
``mlmt-configs/mlmt_trainer.yaml`` (the config reference).
"""

from __future__ import annotations

import re
import textwrap

from omegaconf import DictConfig, OmegaConf

from agent_system.config import CONFIG_DIR

HELP, HELP_ALL = ("--help", "-h"), "--help-all"
WIDTH = 120  # of a wrapped comment line
KEY_COLUMN = 44  # where the comments start
_KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][\w@]*):(.*)$")


def requested(argv: list[str]) -> str | None:
    """Which page ``argv`` asks for: "help", "help-all", "cfg" (``--cfg job`` / ``-c job``), or None (a run)."""
    if HELP_ALL in argv:
        return "help-all"
    if any(flag in argv for flag in HELP):
        return "help"
    for flag in ("--cfg", "-c"):
        if flag in argv and argv.index(flag) + 1 < len(argv) and argv[argv.index(flag) + 1] == "job":
            return "cfg" if not {"--package", "-p"} & set(argv) else None  # a package: Hydra's own flag
    return None


def overrides_of(argv: list[str]) -> list[str]:
    """``argv`` less the flags this module reads."""
    flags = {*HELP, HELP_ALL, "--resolve"}
    dropped = {i + 1 for i, arg in enumerate(argv) if arg in ("--cfg", "-c")}
    return [arg for i, arg in enumerate(argv) if arg not in flags and arg not in ("--cfg", "-c") and i not in dropped]


def yaml_comments(text: str) -> dict[str, str]:
    """``{dotted key: its comment}`` of a commented YAML file: the comment beside a key, joined with the comment-only
    lines under it that are indented past the key (its continuation)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last, last_indent = None, 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if last and len(line) - len(line.lstrip()) > last_indent:
                comments[last] += " " + stripped.lstrip("#").strip()
            continue
        match = _KEY_LINE.match(line)
        last = None
        if not match:
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if " #" in rest:
            last, last_indent = ".".join(name for _, name in stack), indent
            comments[last] = rest.split(" #", 1)[1].strip()
    return comments


def _value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return re.sub(r"\bNone\b", "null", str(value)).replace("'", "")
    return str(value)


def _line(left: str, comment: str | None) -> list[str]:
    if not comment:
        return [left]
    lead = left.ljust(KEY_COLUMN - 1) + " # "
    return textwrap.wrap(comment, WIDTH, initial_indent=lead, subsequent_indent=" " * (KEY_COLUMN - 1) + " # ")


def _mlmt_lines(node: dict, prefix: str, comments: dict[str, str]) -> list[str]:
    lines = []
    for name, value in node.items():
        path = f"{prefix}.{name}"
        if isinstance(value, dict) and value:
            lines += _line(f"  {path}:", comments.get(path)) if comments.get(path) else []
            lines += _mlmt_lines(value, path, comments)
        else:
            lines += _line(f"  {path}={_value(value)}", comments.get(path))
    return lines


def _leaves(node: object) -> int:
    return sum(_leaves(value) for value in node.values()) if isinstance(node, dict) and node else 1


def help_page(config: DictConfig, target: str) -> str:
    """``--help``: the ``mlmt.*`` keys with their values here and comments, verl's groups one line each."""
    comments = yaml_comments((CONFIG_DIR / "mlmt_trainer.yaml").read_text())
    tree = OmegaConf.to_container(config, resolve=False)
    lines = [
        "usage: python -m verl.trainer.main_mlmt [key=value ...]   (--help-all or --cfg job: every key)",
        "",
        "MLMT-RL trains a solver (LL) and a feedback writer (HL) jointly on verl. The values below are the config this",
        f"machine runs with the overrides given: {target}.",
        "Comments: mlmt-configs/mlmt_trainer.yaml; docs/CONFIG.md.",
        "",
        "mlmt: the project's keys",
        *_mlmt_lines(tree["mlmt"], "mlmt", comments),
        "",
        "verl's groups, folded (--help-all or --cfg job shows their keys; the YAML's changes to them: docs/CONFIG.md):",
    ]
    for name, value in tree.items():
        if name != "mlmt":
            lines += _line(f"  {name} ({_leaves(value)} keys)", comments.get(name))
    return "\n".join(lines) + "\n"


def page(argv: list[str]) -> str | None:
    """The text ``argv`` asks for (:func:`requested`), or None for a run.

    Raises:
        agent_system.config.ConfigError: A bad ``mlmt.plan_device`` among the overrides (as a run would).
    """
    from agent_system.config import compose_config
    from agent_system.launcher.devices import plan_target

    kind = requested(argv)
    if kind is None:
        return None
    config = compose_config(overrides_of(argv))
    if kind == "cfg":
        return OmegaConf.to_yaml(config, resolve="--resolve" in argv)
    text = help_page(config, plan_target(config))
    return text if kind == "help" else text + "\nThe whole config:\n" + OmegaConf.to_yaml(config)
