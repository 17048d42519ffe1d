"""A fake OpenAI-compatible chat-completions server, for the worker benchmark and the tests.

Speaks the real wire protocol (`POST /v1/chat/completions`, also `/chat/completions`) so the
real `openai` client is exercised. Modes, switchable at runtime via `server.set_mode`:

- "ok": a deterministic summary built from the request (the "User:" lines it saw), with usage
- "500": HTTP 500 with an OpenAI-style error body
- "timeout": holds the request for `delay_s` seconds (set it above the client timeout)
- "empty": a 200 answer whose content is ""
- "garbage": a 200 answer whose content is mostly non-text
- "refusal": a 200 answer "I'm sorry, but I cannot help with that."
- "long": a 200 answer of `long_words` words (to exceed a token bound)
- "nul", "surrogate": the "ok" summary with a NUL / a lone UTF-16 surrogate inside (text
  Postgres cannot store)
- "context_length": HTTP 400 `context_length_exceeded` (an error no retry can fix)
- "refusal_echo", "garbage_echo": a refusal / garbage that quotes the first user line of the
  prompt (providers do: the library must not pass it on)

Every request body is recorded in `server.requests` (parsed JSON), its headers in
`server.headers`.

    with FakeLLMServer() as llm:
        settings = Settings(openai_base_url=llm.base_url, openai_api_key="sk-test")

`LocalServer` is the threaded 127.0.0.1 server under it, for other fakes to build on.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MODES = (
    "ok",
    "500",
    "timeout",
    "empty",
    "garbage",
    "refusal",
    "long",
    "nul",
    "surrogate",
    "context_length",
    "refusal_echo",
    "garbage_echo",
)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: Any


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 (random port) whose handler reaches this object as
    `self.server.owner`; `start`/`stop`, or use it as a context manager."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], modes: tuple[str, ...]) -> None:
        self.modes = modes
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd = _HTTPServer(("127.0.0.1", 0), handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def set_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise ValueError(f"unknown mode {mode!r}; one of {self.modes}")
        with self.lock:
            self.mode = mode

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class JSONHandler(BaseHTTPRequestHandler):
    """Quiet, HTTP/1.1, and a helper to answer JSON."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: with Nagle's algorithm on, the body waits for
    # the client's delayed ACK of the headers (~40 ms on Linux), which no real LLM endpoint
    # adds and which made every fold of the benchmarks ~40 ms slower than the LLM answered.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def send_body(self, status: int, data: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, payload: Any) -> None:
        self.send_body(status, json.dumps(payload).encode())


def _message_texts(body: dict[str, Any]) -> list[str]:
    texts = []
    for msg in body.get("messages") or []:
        content = msg.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):  # content parts
            texts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return texts


def _user_lines(body: dict[str, Any]) -> list[str]:
    return [
        ln for text in _message_texts(body) for ln in text.splitlines() if ln.startswith("User: ")
    ]


def deterministic_summary(body: dict[str, Any]) -> str:
    """What "ok" answers: the user queries of the conversation, in order."""
    queries = [line[len("User: ") :].strip() for line in _user_lines(body)]
    asked = "; ".join(queries) if queries else "nothing new"
    return f"Running summary of the analysis. The user asked: {asked}."


def _content(owner: FakeLLMServer, mode: str, body: dict[str, Any]) -> str:
    first_user_line = next(iter(_user_lines(body)), "")
    contents = {
        "empty": lambda: "",
        "garbage": lambda: "\x00\x01 ### 0101 $$%%^^ ~~~ \ufffd\ufffd 42 ::: ### 9999 \x02",
        "refusal": lambda: "I'm sorry, but I cannot help with that.",
        "long": lambda: " ".join(f"summary{i % 50}" for i in range(owner.long_words)),
        "nul": lambda: deterministic_summary(body).replace(". ", ".\x00 ", 1),
        "surrogate": lambda: deterministic_summary(body).replace(". ", ".\ud800 ", 1),
        "refusal_echo": lambda: f"I'm sorry, I cannot summarize this: {first_user_line}",
        "garbage_echo": lambda: (
            "#### 0000 1111 2222 3333 4444 5555 6666 7777 8888 9999 $$$$ "
            f"%%%% ^^^^ &&&& **** 0101 1010 {first_user_line[:20]}"
        ),
    }
    # Looked up at call time: a test may replace deterministic_summary to script the answer.
    return contents.get(mode, lambda: deterministic_summary(body))()


class _Handler(JSONHandler):
    server: _HTTPServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0] not in ("/v1/chat/completions", "/chat/completions"):
            self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "nf"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send_json(400, {"error": {"message": "bad json", "type": "invalid_request"}})
            return
        owner: FakeLLMServer = self.server.owner
        with owner.lock:
            owner.requests.append(body)
            owner.headers.append({k.lower(): v for k, v in self.headers.items()})
            mode = owner.mode
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._answer(owner, mode, body)  # (in timeout mode the client may be gone)

    def _answer(self, owner: FakeLLMServer, mode: str, body: dict[str, Any]) -> None:
        if mode == "500":
            error = {"message": "fake upstream failure", "type": "server_error"}
            self.send_json(500, {"error": error})
            return
        if mode == "context_length":
            error = {
                "message": "This model's maximum context length is 8192 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            self.send_json(400, {"error": error})
            return
        if mode == "timeout":
            owner.stopping.wait(owner.delay_s)
        content = _content(owner, mode, body)
        prompt_tokens = sum(len(t.split()) for t in _message_texts(body))
        completion_tokens = len(content.split())
        message = {"role": "assistant", "content": content}
        self.send_json(
            200,
            {
                "id": f"chatcmpl-fake-{len(owner.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake-model"),
                "choices": [
                    {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
        )


class FakeLLMServer(LocalServer):
    """Threaded fake chat-completions server on 127.0.0.1, random port."""

    def __init__(self, mode: str = "ok", delay_s: float = 5.0, long_words: int = 4000) -> None:
        super().__init__(_Handler, MODES)
        self.mode = mode
        self.delay_s = delay_s
        self.long_words = long_words
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def calls(self) -> int:
        with self.lock:
            return len(self.requests)

    def prompt_text(self, index: int = -1) -> str:
        """All message contents of one recorded request, joined."""
        with self.lock:
            body = self.requests[index]
        return "\n".join(_message_texts(body))
