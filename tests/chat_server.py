"""A real OpenAI-compatible chat endpoint on 127.0.0.1 (an ephemeral port) for the judge tests: every POST is recorded
and answered by a function of its request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Request:
    """One POST the server received: its path, ``Authorization`` header and JSON body."""

    path: str
    auth: str | None
    body: dict

    @property
    def model(self) -> str:
        return self.body["model"]

    @property
    def user(self) -> str:
        """The text of the last message."""
        return self.body["messages"][-1]["content"]


SLOW_REPLY_S = 30.0  # how late the model "slow" answers: far beyond the judges' timeouts in the tests


def failure(request: Request) -> tuple[int, bytes] | None:
    """The judge tests' failing models: ``error`` (HTTP 500) and ``garbage`` (not JSON) answer so, ``slow`` answers
    after :data:`SLOW_REPLY_S` (None: its reply is the caller's), any other model None."""
    if request.model == "slow":
        time.sleep(SLOW_REPLY_S)
    return {"error": (500, b""), "garbage": (200, b"not json")}.get(request.model)


def chat_reply(content: str) -> bytes:
    """A chat-completions response whose one choice says ``content``."""
    return json.dumps({"choices": [{"message": {"content": content}}]}).encode()


@contextmanager
def chat_server(answer: Callable[[Request], tuple[int, bytes]], seen: list[Request]) -> Iterator[str]:
    """Serve ``answer`` (a request → (HTTP status, body)) until the block ends; yields the base URL (``.../v1``) and
    appends each request to ``seen``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            request = Request(self.path, self.headers.get("Authorization"), body)
            seen.append(request)
            status, payload = answer(request)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
