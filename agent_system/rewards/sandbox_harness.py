"""Child side of the code sandbox: runs one candidate program against its test asserts (or evaluates calls).

This file is never imported by the trainer. ``agent_system.rewards.code_sandbox`` reads its source and runs
it as ``python -I -S -c <source>`` inside the sandbox (see that module for the isolation layers). The job
arrives as JSON on stdin; results leave as one JSON line per event on a duplicate of the original stdout,
each line prefixed with a random nonce so that text the candidate writes cannot pass for a result. The
candidate's own stdout/stderr go to /dev/null. Only the standard library is used. A job's optional ``calls`` are
expressions evaluated one by one in the program's namespace (each under the per-test alarm); each reports its
JSON-encodable value or its error (``agent_system.rewards.code_sandbox.run_calls``).
"""

import ast
import json
import os
import resource
import signal
import sys
import traceback


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
        out.write(nonce + json.dumps(event) + "\n")
        out.flush()

    if job["block_sockets"]:
        _block_sockets()
    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "candidate"}
    stage_s = job["limits"]["per_test_s"]
    try:
        # MBPP's test_setup_code builds fixtures from the program's classes, so it runs after the program
        _run_stage(job["code"], "<candidate>", namespace, stage_s)
        _run_stage(job["setup_code"], "<test_setup_code>", namespace, stage_s)
    except BaseException as exc:  # noqa: B036 - SystemExit, KeyboardInterrupt from the candidate
        report({"program_error": _describe_failure(exc, "<program>", namespace)})
        out.close()
        os._exit(0)
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
