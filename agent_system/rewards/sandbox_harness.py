"""Child side of the code sandbox: runs one candidate program, then evaluates its probes (or runs whole tests).

This file is never imported by the trainer. ``agent_system.rewards.code_sandbox`` reads its source and runs
it as ``python -I -S -c <source>`` inside the sandbox (see that module for the isolation layers). The job
arrives as JSON on stdin; results leave as one JSON line per event on a duplicate of the original stdout,
each line prefixed with a random nonce so that text the candidate writes cannot pass for a result. The
candidate's own stdout/stderr go to /dev/null. Only the standard library is used.

A job holds ``probes``: the program's side of each test assert (``add(1, 2)`` of ``assert add(1, 2) == 3``, split by
``agent_system.rewards.assert_split``), with the converter the test wraps it in, if any. Each probe is evaluated in
the program's namespace under the per-test alarm and its value is sent back as plain data (:func:`_encode`: exact
builtin types only, a subclass is not one; the standard library's ``Counter`` / ``OrderedDict`` / ``defaultdict`` as
the dict they hold), never compared here: the expected values and the rest of the asserts are not in this process at
all. The encoder's type objects and functions are bound when this file starts, before the candidate runs. A value
that is not plain, inside a converter of the test (``set(f(x)) == ...`` with a generator), is passed through the real
converter bound here and reported as converted (the trusted side does not apply it again); a ``re.Match`` whose truth
value is tested is sent as True. ``tests`` are asserts that could
not be split and run whole (as before the split, so they can be gamed). ``calls`` are expressions whose value is
sent back JSON-encoded (``agent_system.rewards.code_sandbox.run_calls``, the YAML tasks' functions).
"""

import ast
import collections
import json
import os
import re
import resource
import signal
import sys
import traceback

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
    """Raised by the per-stage alarm."""


def _on_alarm(signum, frame):
    raise TimeLimitExceeded("time limit exceeded")


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


def _describe_failure(exc, test, namespace):
    """A short, feedback-friendly description of a failing test."""
    if isinstance(exc, AssertionError) and not str(exc):
        message = "AssertionError: " + test.strip()
        try:
            node = ast.parse(test.strip()).body[0]
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                left = compile(ast.Expression(node.test.left), "<left>", "eval")
                message += "  (left side evaluated to " + repr(eval(left, namespace))[:200] + ")"
        except BaseException:  # noqa: B036 - anything the candidate raises while re-evaluating
            pass
        return message[:1000]
    lines = traceback.format_exception_only(type(exc), exc)
    return ("".join(lines).strip() + "  [in: " + test.strip()[:200] + "]")[:1000]


def _run_stage(source, filename, namespace, seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        exec(compile(source, filename, "exec"), namespace)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main():
    job = json.loads(sys.stdin.read())
    nonce = job.pop("nonce")
    _apply_limits(job["limits"])
    out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115

    def report(event):
        out.write(nonce + _json_dumps(event) + "\n")
        out.flush()

    if job["block_sockets"]:
        _block_sockets()
    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "candidate"}
    stage_s, program_s = job["limits"]["per_test_s"], job["limits"]["program_s"]
    try:
        # MBPP's test_setup_code builds fixtures from the program's classes, so it runs after the program
        _run_stage(job["code"], "<candidate>", namespace, program_s)
        _run_stage(job["setup_code"], "<test_setup_code>", namespace, program_s)
    except BaseException as exc:  # noqa: B036 - SystemExit, KeyboardInterrupt from the candidate
        report({"program_error": _describe_failure(exc, "<program>", namespace)})
        out.close()
        os._exit(0)
    report({"loaded": True})  # the program and the setup code ran: asserts with no probe can be evaluated
    for index, (probe, wrapper) in enumerate(job.get("probes", [])):
        signal.setitimer(signal.ITIMER_REAL, stage_s)
        try:
            try:
                value = eval(compile(probe, f"<probe {index}>", "eval"), namespace)
                try:
                    event = {"probe": index, "ok": True, "value": _encode(value)}
                except Unverifiable:
                    if wrapper == "bool" and _type(value) is _match_type:
                        event = {"probe": index, "ok": True, "value": ["b", True], "via": wrapper}
                    elif wrapper in _converters:
                        converted = _encode(_converters[wrapper](value))
                        event = {"probe": index, "ok": True, "value": converted, "via": wrapper}
                    else:
                        raise
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Unverifiable as exc:
            event = {"probe": index, "ok": False, "unverifiable": str(exc)}
        except BaseException as exc:  # noqa: B036 - SystemExit, KeyboardInterrupt from the candidate
            try:
                message = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:1000]
            except BaseException:  # noqa: B036 - the candidate's exception may fail to print
                message = "an exception that could not be printed"
            event = {"probe": index, "ok": False, "msg": message}
        report(event)
    for index, call in enumerate(job.get("calls", [])):
        try:
            signal.setitimer(signal.ITIMER_REAL, stage_s)
            try:
                value = eval(compile(call, f"<call {index}>", "eval"), namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            report({"call": index, "ok": True, "value": value})
        except BaseException as exc:  # noqa: B036 - a value json cannot encode lands here too
            report({"call": index, "ok": False, "msg": "".join(traceback.format_exception_only(type(exc), exc))[:1000]})
    for index, test in enumerate(job["tests"]):
        try:
            _run_stage(test, f"<test {index}>", namespace, stage_s)
            report({"test": index, "ok": True})
        except BaseException as exc:  # noqa: B036
            signal.setitimer(signal.ITIMER_REAL, stage_s)  # re-evaluating the left side may loop too
            try:
                message = _describe_failure(exc, test, namespace)
            except BaseException:  # noqa: B036
                message = "test failed: " + test.strip()[:200]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            report({"test": index, "ok": False, "msg": message})
    report({"done": True})
    out.close()
    os._exit(0)  # do not wait for threads the candidate may have left running


if __name__ == "__main__":
    main()
