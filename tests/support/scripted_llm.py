"""A chat-completions server whose every answer a test scripts, to the last field.

`FakeLLMServer` (memory_core/devservices/fake_llm.py) answers in fixed modes and always says
`finish_reason: "stop"`; this one answers what `server.answer(body)` returns: the message's
`content` (a string or None), `refusal`, `tool_calls`, `function_call` and the choice's
`finish_reason` (default "stop"), so a test draws the whole completion. It speaks the same wire
protocol on the same `LocalServer`, and records every request body in `server.requests`.

    with ScriptedLLMServer() as llm:
        llm.answer = lambda body: {"content": "...", "finish_reason": "content_filter"}
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from memory_core.devservices.fake_llm import JSONHandler, LocalServer, _HTTPServer

Answer = dict[str, Any]
_MESSAGE_FIELDS = ("content", "refusal", "tool_calls", "function_call")


def prompt_texts(body: dict[str, Any]) -> list[str]:
    """The contents of a request's messages, in order."""
    return [str(m.get("content") or "") for m in body.get("messages") or []]


class _Handler(JSONHandler):
    server: _HTTPServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        owner: ScriptedLLMServer = self.server.owner
        body = json.loads(raw or b"{}")
        with owner.lock:
            owner.requests.append(body)
        answer = owner.answer(body)
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        message |= {k: answer[k] for k in _MESSAGE_FIELDS if k in answer}
        content = message["content"]
        completion = {
            "id": f"chatcmpl-scripted-{len(owner.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted-model"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": answer.get("finish_reason", "stop"),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": sum(len(t.split()) for t in prompt_texts(body)),
                "completion_tokens": len(content.split()) if isinstance(content, str) else 0,
                "total_tokens": 0,
            },
        }
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_json(200, completion)


class ScriptedLLMServer(LocalServer):
    """Threaded fake chat-completions server on 127.0.0.1 answering `answer(body)`."""

    def __init__(self, answer: Callable[[dict[str, Any]], Answer] | None = None) -> None:
        super().__init__(_Handler, ("scripted",))
        self.mode = "scripted"
        self.answer: Callable[[dict[str, Any]], Answer] = answer or (
            lambda body: {"content": "The user studies revenue by region."}
        )
        self.requests: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"
