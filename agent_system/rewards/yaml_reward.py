"""Grading of YAML-defined tasks: the task's ``score_fn`` / ``done_fn`` / ``split_fn`` run only in the sandbox.

The functions are user code (:mod:`agent_system.data.yaml_task`). They are never imported or executed in the calling
process: one sandbox run (:func:`agent_system.rewards.code_sandbox.run_calls`, the MBPP sandbox's isolation and
limits) defines them and evaluates a whole batch of responses, one call per response, each call under its own time
limit (:data:`CALL_S` at most). A function that raises, times out, or returns something else than a bool / a number
in [0, 1] gives that response score 0 and an ``error`` naming the task file, the item and the function with the
exception text; the caller counts and logs these (:class:`agent_system.rewards.pool.RewardPool` logs one warning per
batch with the counts).

Post-hoc cuts (the trainer generates on a server, without a per-token callback). A response is a list of pieces
(its characters by default, or its token strings) whose concatenation is the response text. ``done_fn(context +
prefix)`` is evaluated on each growing prefix, in order; the first prefix where it is true is the episode's end, and
the response is graded up to there: ``score_fn(context + response[:cut], answer)``. ``split_fn(utterance)`` is
evaluated on the text since the previous utterance end, as recurve generates an utterance until ``split_fn`` holds;
the utterance ends (counted in pieces, up to the episode's end) are returned by :func:`find_cuts` for utterance-level
methods (ArCHer). The MLMT trainer grades with the ``done_fn`` cut only: one MLMT turn is a whole episode, and cutting
it at the first utterance end would grade its first line.

Public API::

    grade(sources, requests, limits=None) -> list[Grade]         # cut at done_fn, then score_fn, one sandbox run
    find_cuts(sources, contexts, pieces, limits=None) -> list[Cuts]   # done_fn end and split_fn utterance ends
    score_batch(items, limits=None) -> list[dict]                # RewardPool items of data_source yaml_task
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace

from agent_system.rewards.code_sandbox import SandboxLimits, run_calls

logger = logging.getLogger(__name__)

DATA_SOURCE = "yaml_task"
CALL_S = 1.0  # the time limit of one response's calls (done_fn over its prefixes, then score_fn), at most
BATCH_SIZE = 16  # responses per sandbox run when RewardPool grades yaml_task items

# Runs in the sandbox (standard library only). The task's sources are defined one by one, each in its own namespace
# under its own file name, so an error names the function; a source that fails to define is reported per call.
_DRIVER = r"""
import json as _mlmt_json
import math as _mlmt_math

_MLMT_SOURCES = _mlmt_json.loads(%r)
_MLMT_FNS, _MLMT_BROKEN = {}, {}


class _MlmtError(Exception):
    pass


for _mlmt_name, _mlmt_source in _MLMT_SOURCES.items():
    try:
        _mlmt_ns = {"__name__": "yaml_task"}
        exec(compile(_mlmt_source, "<" + _mlmt_name + ">", "exec"), _mlmt_ns)
        _MLMT_FNS[_mlmt_name] = _mlmt_ns[_mlmt_name]
    except BaseException as _mlmt_exc:
        _MLMT_BROKEN[_mlmt_name] = type(_mlmt_exc).__name__ + ": " + str(_mlmt_exc)


def _mlmt_call(name, *args):
    if name in _MLMT_BROKEN:
        raise _MlmtError(name + " could not be defined: " + _MLMT_BROKEN[name])
    try:
        return _MLMT_FNS[name](*args)
    except BaseException as exc:
        raise _MlmtError(name + " raised " + type(exc).__name__ + ": " + str(exc)[:500]) from None


def _mlmt_flag(name, value):
    if isinstance(value, (bool, int, float)):
        return bool(value)
    raise _MlmtError(name + " returned " + repr(value)[:100] + " (" + type(value).__name__ + "), not a bool")


def _mlmt_grade(payload):
    item = _mlmt_json.loads(payload)
    context, pieces, out = item["context"], item["pieces"], {"done_at": None, "utterance_ends": None}
    try:
        if item["cut"] and "done_fn" in _MLMT_SOURCES:
            text = context
            for k, piece in enumerate(pieces):
                text += piece
                if _mlmt_flag("done_fn", _mlmt_call("done_fn", text)):
                    out["done_at"] = k + 1
                    break
        kept = pieces if out["done_at"] is None else pieces[: out["done_at"]]
        if item["utterances"] and "split_fn" in _MLMT_SOURCES:
            ends, current = [], ""
            for k, piece in enumerate(kept):
                current += piece
                if _mlmt_flag("split_fn", _mlmt_call("split_fn", current)):
                    ends.append(k + 1)
                    current = ""
            out["utterance_ends"] = ends
        if item["score"]:
            value = _mlmt_call("score_fn", context + "".join(kept), item["answer"])
            if isinstance(value, bool) or (isinstance(value, (int, float)) and _mlmt_math.isfinite(value)):
                value = float(value)
            else:
                raise _MlmtError("score_fn returned " + repr(value)[:100] + " (" + type(value).__name__
                                 + "), not a bool or a finite number")
            if not 0.0 <= value <= 1.0:
                raise _MlmtError("score_fn returned " + repr(value) + ", outside [0, 1]")
            out["score"] = value
    except _MlmtError as exc:
        out["error"] = str(exc)
    return out
"""


@dataclass(frozen=True)
class Request:
    """One response to grade.

    Attributes:
        response: The generated text (without the prompt).
        answer: The item's gold answer (``score_fn``'s second argument).
        context: What precedes the response in ``score_fn`` / ``done_fn``'s ``text`` (recurve passes the entire
            context: the chat-templated prompt, then the response); "" grades the response alone.
        pieces: The response split where ``done_fn`` / ``split_fn`` are evaluated (its token strings); None: its
            characters. Their concatenation must be ``response``.
        label: Names the response in error messages (e.g. ``task.yaml item 3``).
    """

    response: str
    answer: str = ""
    context: str = ""
    pieces: list[str] | None = None
    label: str = ""


@dataclass
class Grade:
    """The outcome of one :class:`Request`: ``score`` (0 on an error), ``done_at`` (pieces kept: the first prefix
    where ``done_fn`` held, None if it never did or there is none), ``utterance_ends`` and ``error``."""

    score: float = 0.0
    done_at: int | None = None
    utterance_ends: list[int] | None = None
    error: str | None = None
    graded_text: str = ""  # the part of the response score_fn read


@dataclass
class Cuts:
    """Where a response's episode ends (``done_at`` pieces) and its utterances end (``utterance_ends``)."""

    done_at: int | None = None
    utterance_ends: list[int] = field(default_factory=list)
    error: str | None = None


def _limits(limits: SandboxLimits | None, count: int) -> SandboxLimits:
    """Per-call limit ``CALL_S`` (or less); the run's wall-clock limit: the given one, else room for every call. The
    program (the task's sources defined) keeps the run's per-test limit: defining them under a response's 1 s failed
    every response of a batch when the machine was busy (a CI run beside two vLLM servers starting)."""
    limits = limits or SandboxLimits(timeout_s=2.0 + CALL_S * count)
    return replace(limits, per_test_s=min(CALL_S, limits.per_test_s), program_s=limits.per_test_s)


def _pieces(request: Request) -> list[str]:
    if request.pieces is None:
        return list(request.response)
    if "".join(request.pieces) != request.response:
        raise ValueError(f"{request.label or 'request'}: the pieces do not concatenate to the response")
    return list(request.pieces)


def _run(sources: dict[str, str], requests: list[Request], modes: dict, limits: SandboxLimits | None) -> list[dict]:
    """One sandbox run over ``requests``: one dict per request (``done_at``, ``utterance_ends``, ``score``, or
    ``error`` with the request's label)."""
    if "score_fn" not in sources and modes["score"]:
        raise ValueError("the task's sources have no score_fn")
    payloads = [json.dumps({"context": r.context, "pieces": _pieces(r), "answer": r.answer, **modes}) for r in requests]
    program = _DRIVER % json.dumps({name: src for name, src in sources.items() if src})
    result = run_calls(program, [f"_mlmt_grade({payload!r})" for payload in payloads], _limits(limits, len(requests)))
    outs = []
    for request, (kind, value) in zip(requests, result.outcomes, strict=True):
        prefix = f"{request.label}: " if request.label else ""
        if kind == "ok" and isinstance(value, dict):
            out = dict(value)
            if out.get("error"):
                out["error"] = prefix + out["error"]
        elif kind == "error":
            out = {"error": f"{prefix}{value.strip()} (in the sandbox)"}
        else:
            out = {"error": f"{prefix}{value}"}
        outs.append(out)
    return outs


def grade(sources: dict[str, str], requests: list[Request], limits: SandboxLimits | None = None) -> list[Grade]:
    """Cuts each response at ``done_fn`` (when the task has one) and scores the kept part with ``score_fn``, all in one
    sandbox run.

    Args:
        sources: Function name -> source (:attr:`agent_system.data.yaml_task.YamlTask.sources`).
        requests: The responses.
        limits: Sandbox limits; the run's ``timeout_s`` bounds the whole batch, each request's calls have at most
            :data:`CALL_S`. Default: room for every call.

    Returns:
        One :class:`Grade` per request; an error scores 0 and says which function failed on which request.
    """
    if not requests:
        return []
    outs = _run(sources, requests, {"cut": True, "utterances": True, "score": True}, limits)
    grades = []
    for request, out in zip(requests, outs, strict=True):
        pieces = _pieces(request)
        done_at = out.get("done_at")
        graded = "".join(pieces if done_at is None else pieces[:done_at])
        if out.get("error"):
            grades.append(Grade(0.0, done_at, out.get("utterance_ends"), out["error"], graded))
        else:
            grades.append(Grade(float(out["score"]), done_at, out.get("utterance_ends"), None, graded))
    return grades


def find_cuts(
    sources: dict[str, str], contexts: list[str], pieces: list[list[str]], limits: SandboxLimits | None = None
) -> list[Cuts]:
    """The episode end (first prefix where ``done_fn(context + prefix)`` holds) and the utterance ends (``split_fn`` on
    the text since the previous end) of each response given as its pieces (token strings or characters), all in one
    sandbox run. Counts are in pieces: ``done_at = k`` keeps ``pieces[:k]``."""
    requests = [Request("".join(p), "", c, list(p)) for c, p in zip(contexts, pieces, strict=True)]
    if not requests:
        return []
    outs = _run(sources, requests, {"cut": True, "utterances": True, "score": False}, limits)
    return [Cuts(o.get("done_at"), o.get("utterance_ends") or [], o.get("error")) for o in outs]


def _item_sources(extra_info: dict) -> dict[str, str]:
    return {name: extra_info.get(name) or "" for name in ("score_fn", "done_fn", "split_fn") if extra_info.get(name)}


def _label(extra_info: dict) -> str:
    return f"{extra_info.get('task_file') or 'yaml task'} item {extra_info.get('item_index', '?')}"


def score_batch(items: list[dict], limits: SandboxLimits | None = None) -> list[dict]:
    """Grades RewardPool items of data source ``yaml_task`` (a row's ``extra_info`` carries the sources): one sandbox
    run per distinct task in ``items``.

    An item may carry ``prompt_str`` (the context before the response; default "") and ``solution_pieces``.

    Returns:
        Per item ``{"score", "acc", "pred", "error", "done_at"}``; ``pred`` is the graded part of the response.
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        groups[json.dumps(_item_sources(item.get("extra_info") or {}), sort_keys=True)].append(index)
    results: list[dict | None] = [None] * len(items)
    for key, indices in groups.items():
        requests = []
        for index in indices:
            item, extra = items[index], items[index].get("extra_info") or {}
            requests.append(
                Request(
                    str(item["solution_str"] or ""),
                    str(item["ground_truth"]),
                    str(item.get("prompt_str") or ""),
                    item.get("solution_pieces"),
                    _label(extra),
                )
            )
        sources = json.loads(key)
        if "score_fn" not in sources:
            grades = [Grade(error=f"{r.label}: the row has no score_fn in extra_info") for r in requests]
        else:
            grades = grade(sources, requests, limits)
        for index, result in zip(indices, grades, strict=True):
            results[index] = {
                "score": result.score,
                "acc": result.error is None and result.score >= 1.0,
                "pred": result.graded_text,
                "error": result.error,
                "done_at": result.done_at,
            }
    return results  # type: ignore[return-value]


def grading_context(row: dict, prompt_ids: list[int], tokenizer) -> str | None:
    """For a ``yaml_task`` row, the text before the response as recurve gives it to ``score_fn``: the prompt the model
    read, decoded with its chat template's special tokens (so ``text.split("assistant")[-1]`` is the response);
    None for other rows."""
    if row.get("data_source") != DATA_SOURCE:
        return None
    return tokenizer.decode(prompt_ids, skip_special_tokens=False)
