"""Child side of the code sandbox: runs one candidate program, then evaluates its probes (or runs whole tests).

This file is never imported by the trainer. ``agent_system.rewards.code_sandbox`` reads its source and runs
it as ``python -I -S -c <source>`` inside the sandbox (see that module for the isolation layers; with namespaces,
``sandbox_isolation.py`` runs first and execs this). The job
arrives as JSON on stdin; results leave as one JSON line per event on a duplicate of the original stdout,
each line prefixed with a random nonce so that text the candidate writes cannot pass for a result. The
candidate's own stdout/stderr go to /dev/null. Only the standard library is used.

A job holds ``probes``: the program's side of each test assert (``add(1, 2)`` of ``assert add(1, 2) == 3``, split by
``agent_system.rewards.assert_split``), with the converter the test wraps it in, if any. Each probe is evaluated in
the program's namespace under the stage's alarm and its value is sent back as plain data (:func:`_encode`: exact
builtin types only, a subclass is not one; the standard library's ``Counter`` / ``OrderedDict`` / ``defaultdict`` as
the dict they hold), never compared here: the expected values and the rest of the asserts are not in this process at
all. The encoder's type objects and functions are bound when this file starts, before the candidate runs. A value
that is not plain, inside a converter of the test (``set(f(x)) == ...`` with a generator), is passed through the real
converter bound here and reported as converted (the trusted side does not apply it again); a ``re.Match`` whose truth
value is tested is sent as True. ``tests`` are asserts that could
not be split and run whole (as before the split, so they can be gamed). ``calls`` are expressions whose value is
sent back JSON-encoded (``agent_system.rewards.code_sandbox.run_calls``, the YAML tasks' functions).
"""

import _ast  # not ast: its import (enum, contextlib, ...) would cost every run 8 ms
import collections
import json
import os
import re
import resource
import signal
import sys
import time
from functools import partial

# bound before any candidate code runs: the encoder below uses only these
# (compared by identity: a metaclass's __eq__ / __hash__ cannot make a class pass for one of these)
_exact_scalars = ((type(None), "n"), (bool, "b"), (int, "i"), (float, "f"), (complex, "c"), (str, "s"), (bytes, "y"))
_exact_containers = ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F"), (dict, "d"))
# the standard library's dict subclasses, sent as the dict they hold (read with dict.items itself, so none of their
# methods runs; a dict literal compares equal to them exactly when it equals that dict)
_dict_like = (collections.Counter, collections.OrderedDict, collections.defaultdict)
_type, _float_hex, _hex, _dict_items, _json_dumps = type, float.hex, hex, dict.items, json.dumps
_type_name = type.__dict__["__qualname__"].__get__
# the real converters, for a probe the test wraps in one of them when its value itself is not plain (a generator)
_match_type = type(re.match("", ""))  # always true; final (no subclass can change that); a test of a truth value
_converters = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "sorted": sorted}
_MAX_DEPTH = 100


class Unverifiable(Exception):
    """A probe's value is not plain data."""


def _encode(value, depth=0):
    """The value as tagged plain data (decoded by ``agent_system.rewards.assert_split.decode_value``)."""
    if depth > _MAX_DEPTH:
        raise Unverifiable("a value nested deeper than " + str(_MAX_DEPTH) + " levels (or a cycle)")
    kind = _type(value)
    for exact, tag in _exact_scalars:
        if kind is exact:
            if tag == "n":
                return ["n"]
            if tag == "i":
                return ["i", _hex(value)]
            if tag == "f":
                return ["f", _float_hex(value)]
            if tag == "c":
                return ["c", [_float_hex(value.real), _float_hex(value.imag)]]
            if tag == "y":
                return ["y", value.hex()]
            return [tag, value]
    for exact in _dict_like:
        if kind is exact:
            return ["d", [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in _dict_items(value)]]
    for exact, tag in _exact_containers:
        if kind is exact:
            if tag == "d":
                return ["d", [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in _dict_items(value)]]
            return [tag, [_encode(item, depth + 1) for item in value]]
    raise Unverifiable("a value of type " + str(_type_name(kind))[:100] + ", not plain data")


class TimeLimitExceeded(Exception):
    """Raised by the stage's alarm."""


# Every stage that runs the program's code (loading it, each probe, call or whole test, and the description of what it
# raised, which runs its __str__) runs under the stage's clocks, and so does everything after them until the next
# stage starts: a finalizer (__del__) or a signal handler of the program can run at any moment. The alarm raises
# TimeLimitExceeded once, then gives the stage _GRACE_S to describe and report it; if the alarm fires again (the
# program swallowed it and went on), the run ends there with an "aborted" event. What the alarm cannot interrupt (C code
# that never returns to the interpreter, sum(range(10 ** 13)) in any thread; a program that swallows, starves or
# switches off the alarm) the parent ends: it expects each stage's event within the stage's limit plus 2 * _GRACE_S.
_GRACE_S = 1.0
_clock = {"strikes": 0, "interrupt": True, "due": 0.0, "end": None}
_monotonic = time.monotonic


def _on_alarm(signum, frame):
    now = _monotonic()
    if now < _clock["due"] - 0.001:  # the alarm of an earlier stage, handled only now (the process waited for a core)
        return
    _clock["strikes"] += 1
    if _clock["strikes"] > 1:
        _clock["end"]("time limit exceeded (the program went on after its alarm)")
    _clock["due"] = now + _GRACE_S
    signal.setitimer(signal.ITIMER_REAL, _GRACE_S)
    if _clock["interrupt"]:
        raise TimeLimitExceeded("time limit exceeded")


def _arm(seconds, interrupt=True):
    """Starts a stage's clocks: the alarm after ``seconds`` (it raises TimeLimitExceeded when ``interrupt``, else only
    counts: the harness's own write of a result is never cut halfway)."""
    _clock["strikes"], _clock["interrupt"], _clock["due"] = 0, interrupt, _monotonic() + seconds
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _check_privileges():
    """The check of ``sandbox_isolation``'s work: no capability is left (a failure ends the run before the program
    starts, and the probe falls back to a weaker mode)."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status.read().splitlines() if ":" in line)
    if any(int(fields[key], 16) for key in ("CapPrm", "CapEff", "CapAmb")):
        raise OSError("sandbox isolation: capabilities left")


def _apply_limits(limits):
    """Lowers the resource limits of this process (and of everything it forks)."""
    mib = 1024 * 1024
    pairs = [
        (resource.RLIMIT_AS, limits["memory_mb"] * mib),
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
        (resource.RLIMIT_FSIZE, limits["max_file_mb"] * mib),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ]
    for kind, value in pairs:
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            soft, hard = resource.getrlimit(kind)
            resource.setrlimit(kind, (min(value, hard) if hard >= 0 else value, hard))


def _block_sockets():
    """Best-effort in-process network block (the network namespace is the real barrier)."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

    class _NoSocket(socket.socket):
        def __init__(self, family=-1, *args, **kwargs):
            if family != getattr(socket, "AF_UNIX", None):
                refuse()
            super().__init__(family, *args, **kwargs)

    socket.socket = _NoSocket
    socket.create_connection = refuse
    socket.getaddrinfo = refuse


def _message(exc):
    """``Type: text`` of the program's exception (runs its ``__str__``, ``__notes__``: call under a stage's clocks)."""
    try:
        import traceback  # here, not at the start: most runs raise nothing, and the import costs each run 3 ms

        return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:1000]
    except BaseException:  # noqa: B036 - the alarm, or an exception raised while printing this one
        return "an exception that could not be printed"


def _describe_failure(exc, test, namespace):
    """A short, feedback-friendly description of a failing test (runs the program's code: call under a stage's
    clocks)."""
    try:
        if isinstance(exc, AssertionError) and not str(exc):
            message = "AssertionError: " + test.strip()
            try:
                node = compile(test.strip(), "<test>", "exec", _ast.PyCF_ONLY_AST).body[0]
                if isinstance(node, _ast.Assert) and isinstance(node.test, _ast.Compare):
                    left = compile(_ast.Expression(node.test.left), "<left>", "eval")
                    message += "  (left side evaluated to " + repr(eval(left, namespace))[:200] + ")"
            except BaseException:  # noqa: B036 - anything the candidate raises while re-evaluating
                pass
            return message[:1000]
        return (_message(exc) + "  [in: " + test.strip()[:200] + "]")[:1000]
    except BaseException:  # noqa: B036 - the alarm, or the program's __str__ raising while being tested for emptiness
        return "test failed: " + test.strip()[:200]


def _stage(seconds, work, fail, fallback):
    """The JSON text of one stage's event: ``work()``, or ``fail(exc)`` when that raises, both under the stage's clocks
    (encoding a call's value may run the program's code too); ``fallback`` when the alarm cut ``fail`` short."""
    try:
        _arm(seconds)
        try:
            text = work()
        except BaseException as exc:  # noqa: B036 - SystemExit, KeyboardInterrupt from the candidate
            text = fail(exc)
        _clock["interrupt"] = False  # from here on an alarm only counts (an earlier one lands in the except below)
    except BaseException:  # noqa: B036 - the alarm while describing the failure
        _clock["interrupt"] = False
        text = _json_dumps(fallback)
    return text


def _probe_event(index, probe, wrapper, namespace):
    value = eval(compile(probe, f"<probe {index}>", "eval"), namespace)
    try:
        event = {"probe": index, "ok": True, "value": _encode(value)}
    except Unverifiable:
        if wrapper == "bool" and _type(value) is _match_type:
            event = {"probe": index, "ok": True, "value": ["b", True], "via": wrapper}
        elif wrapper in _converters:
            event = {"probe": index, "ok": True, "value": _encode(_converters[wrapper](value)), "via": wrapper}
        else:
            raise
    return _json_dumps(event)


def _probe_failure(index, exc):
    if isinstance(exc, Unverifiable):
        return _json_dumps({"probe": index, "ok": False, "unverifiable": str(exc)})
    return _json_dumps({"probe": index, "ok": False, "msg": _message(exc)})


def _call_event(index, call, namespace):
    value = eval(compile(call, f"<call {index}>", "eval"), namespace)
    return _json_dumps({"call": index, "ok": True, "value": value})  # a value json cannot encode goes to the failure


def _call_failure(index, exc):
    return _json_dumps({"call": index, "ok": False, "msg": _message(exc)})


def _test_event(index, test, namespace):
    exec(compile(test, f"<test {index}>", "exec"), namespace)
    return _json_dumps({"test": index, "ok": True})


def _test_failure(index, test, namespace, exc):
    return _json_dumps({"test": index, "ok": False, "msg": _describe_failure(exc, test, namespace)})


def _load(job, namespace, program_s):
    # MBPP's test_setup_code builds fixtures from the program's classes, so it runs after the program
    exec(compile(job["code"], "<candidate>", "exec"), namespace)
    _arm(program_s)
    exec(compile(job["setup_code"], "<test_setup_code>", "exec"), namespace)
    return _json_dumps({"loaded": True})  # asserts with no probe can be evaluated


def _load_failure(namespace, exc):
    return _json_dumps({"program_error": _describe_failure(exc, "<program>", namespace)})


def main():
    job = json.loads(sys.stdin.read())
    nonce = job.pop("nonce")
    if job["isolation_mode"] != "none":
        _check_privileges()
    stage_s, program_s = job["limits"]["per_test_s"], job["limits"]["program_s"]
    _apply_limits(job["limits"])
    out = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115

    def write(text):
        data = (nonce + text + "\n").encode()
        while data:
            data = data[os.write(out, data) :]

    def report(text):
        _arm(stage_s, interrupt=False)  # what the program may still run meanwhile (a finalizer) stays bounded
        write(text)

    def end(reason):
        try:
            os.write(out, b"\n")  # after a line the alarm may have cut
            write(_json_dumps({"aborted": reason}))
        finally:
            os._exit(0)

    _clock["end"] = end
    if job["block_sockets"]:
        _block_sockets()
    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "candidate"}
    unprintable = "an exception that could not be printed"
    write(_json_dumps({"started": True}))  # the parent's clock for the program's stages starts here
    loaded = _stage(
        program_s,
        partial(_load, job, namespace, program_s),
        partial(_load_failure, namespace),
        {"program_error": unprintable},
    )
    report(loaded)
    if not loaded.startswith('{"loaded"'):
        os._exit(0)
    for index, (probe, wrapper) in enumerate(job.get("probes", [])):
        work = partial(_probe_event, index, probe, wrapper, namespace)
        report(_stage(stage_s, work, partial(_probe_failure, index), {"probe": index, "ok": False, "msg": unprintable}))
    for index, call in enumerate(job.get("calls", [])):
        work = partial(_call_event, index, call, namespace)
        report(_stage(stage_s, work, partial(_call_failure, index), {"call": index, "ok": False, "msg": unprintable}))
    for index, test in enumerate(job["tests"]):
        work, fail = partial(_test_event, index, test, namespace), partial(_test_failure, index, test, namespace)
        report(_stage(stage_s, work, fail, {"test": index, "ok": False, "msg": "test failed: " + test.strip()[:200]}))
    report(_json_dumps({"done": True}))
    os._exit(0)  # do not wait for threads the candidate may have left running


if __name__ == "__main__":
    main()
