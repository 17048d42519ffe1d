"""A fake Langfuse server for tests, speaking what the langfuse 5 SDK sends.

- `GET /api/public/v2/prompts/{name}` (the SDK's `get_prompt`), modes via `server.mode`:
  "served" (a text or chat prompt, `prompt_type`, with version `version` and the variables
  `{{previous_summary}}` / `{{conversation}}`), "401", "404", "500".
- `POST /api/public/otel/v1/traces`: OTLP/HTTP protobuf (gzip or not), decoded into
  `server.spans` (name, attributes, scope) so tests can find the generations.
- `POST /api/public/ingestion`: legacy JSON batches, recorded in `server.ingestion`.

Also here: `HangingServer` (accepts TCP connections, never answers): Langfuse, or any HTTP
service, hanging. The server machinery is the fake LLM's (memory_core/devservices/fake_llm.py).
"""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from memory_core.devservices.fake_llm import JSONHandler, LocalServer, _HTTPServer

MODES = ("served", "401", "404", "500")

TEXT_TEMPLATE = (
    "LANGFUSE PROMPT. Update the running summary of this analytics conversation.\n"
    "Previous summary:\n{{previous_summary}}\n\nNew turns:\n{{conversation}}\n"
)
CHAT_TEMPLATE = [
    {"role": "system", "content": "LANGFUSE PROMPT. You keep analytics conversation memory."},
    {
        "role": "user",
        "content": "Previous summary:\n{{previous_summary}}\n\nNew turns:\n{{conversation}}",
    },
]


def _any_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def decode_otlp(body: bytes, encoding: str | None) -> list[dict[str, Any]]:
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            scope = {kv.key: _any_value(kv.value) for kv in scope_spans.scope.attributes}
            for span in scope_spans.spans:
                spans.append(
                    {
                        "name": span.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "scope": scope_spans.scope.name,
                        "scope_attributes": scope,
                        "attributes": {kv.key: _any_value(kv.value) for kv in span.attributes},
                    }
                )
    return spans


class _Handler(JSONHandler):
    server: _HTTPServer  # its owner is the FakeLangfuseServer (LocalServer)

    def do_GET(self) -> None:
        owner: FakeLangfuseServer = self.server.owner
        path = urlsplit(self.path).path
        prefix = "/api/public/v2/prompts/"
        if not path.startswith(prefix):
            self.send_json(404, {"message": f"no route {path}"})
            return
        name = unquote(path[len(prefix) :])
        with owner.lock:
            owner.prompt_requests.append(
                {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
            )
            mode = owner.mode
        if mode == "401":
            self.send_json(
                401,
                {
                    "message": "Invalid credentials. Confirm that you've configured "
                    "the correct host."
                },
            )
        elif mode == "404" or name not in owner.prompt_names:
            self.send_json(404, {"error": "LangfuseNotFoundError", "message": "Prompt not found"})
        elif mode == "500":
            self.send_json(500, {"message": "Internal Server Error"})
        else:
            self.send_json(200, owner.prompt_payload(name))

    def do_POST(self) -> None:
        owner: FakeLangfuseServer = self.server.owner
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        if path == "/api/public/otel/v1/traces":
            spans = decode_otlp(raw, self.headers.get("Content-Encoding"))
            with owner.lock:
                owner.spans.extend(spans)
                owner.otel_headers.append({k.lower(): v for k, v in self.headers.items()})
            self.send_body(
                200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf"
            )
        elif path == "/api/public/ingestion":
            with owner.lock:
                owner.ingestion.append(json.loads(raw or b"{}"))
            self.send_json(207, {"successes": [], "errors": []})
        else:
            self.send_json(404, {"message": f"no route {path}"})


class FakeLangfuseServer(LocalServer):
    """Threaded fake Langfuse API on 127.0.0.1, random port."""

    def __init__(
        self,
        mode: str = "served",
        prompt_type: str = "text",
        version: int = 3,
        prompt_names: tuple[str, ...] = ("conversation_summarizer",),
    ) -> None:
        super().__init__(_Handler, MODES)
        self.mode = mode
        self.prompt_type = prompt_type
        self.version = version
        self.prompt_names = prompt_names
        self.prompt_requests: list[dict[str, Any]] = []
        self.spans: list[dict[str, Any]] = []
        self.otel_headers: list[dict[str, str]] = []
        self.ingestion: list[Any] = []
        self.text_prompt: tuple[str, int] | None = None  # (template, version)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve_text_prompt(self, template: str, version: int) -> None:
        """Serve `template` (a text prompt, as written in the Langfuse UI) from now on."""

        self.text_prompt = (template, version)

    def prompt_payload(self, name: str) -> dict[str, Any]:
        if self.text_prompt is not None:
            template, version = self.text_prompt
            return {
                "type": "text",
                "name": name,
                "version": version,
                "prompt": template,
                "config": {},
                "labels": ["production"],
                "tags": [],
            }
        prompt: Any = TEXT_TEMPLATE if self.prompt_type == "text" else CHAT_TEMPLATE
        return {
            "type": self.prompt_type,
            "name": name,
            "version": self.version,
            "prompt": prompt,
            "config": {},
            "labels": ["production", "latest"],
            "tags": [],
            "commitMessage": None,
        }

    def generations(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                s
                for s in self.spans
                if s["attributes"].get("langfuse.observation.type") == "generation"
            ]


class HangingServer:
    """Accepts TCP connections (the kernel backlog does) and never answers a byte."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> HangingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
