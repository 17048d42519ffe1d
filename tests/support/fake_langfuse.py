"""A fake Langfuse server for tests, speaking what the langfuse 5 SDK sends.

- `GET /api/public/v2/prompts/{name}` (the SDK's `get_prompt`), modes via `server.mode`:
  "served" (a text or chat prompt, `prompt_type`, with version `version` and the variables
  `{{previous_summary}}` / `{{conversation}}`), "401", "404", "500".
- `POST /api/public/otel/v1/traces`: OTLP/HTTP protobuf (gzip or not), decoded into
  `server.spans` (name, ids, times, attributes, scope) so tests can find the generations.
- `POST /api/public/ingestion`: legacy JSON batches, recorded in `server.ingestion`.

The trace API: traces are the spans in `server.spans` (exported or seeded with
`server.add_trace(trace_id, session_id)`) grouped by trace id; a trace's session is the
`session.id` span attribute (what `propagate_attributes(session_id=...)` writes).

- `GET /api/public/v2/observations` (the SDK's `api.observations.get_many` /
  `iter_observation_pages`): query `sessionId`, `traceId`, `limit` (1..1000), `cursor`;
  pages of at most `server.max_page_size` observations (Langfuse's may be short too), newest
  first, `meta.cursor` absent on the last page.
- `GET /api/public/traces` (the legacy list): query `sessionId`, `page`, `limit` (1..100);
  `{"data": [trace...], "meta": {"page", "limit", "totalItems", "totalPages"}}`.
- `DELETE /api/public/traces` (JSON `{"traceIds": [...]}`) and `DELETE /api/public/traces/{id}`:
  the traces' spans are removed; ids recorded in `server.deleted_trace_ids`.

These need Basic auth (401 otherwise); every call is recorded in `server.trace_requests`.
Failure modes, `server.set_trace_api_mode(...)`: "ok", "500", "401", "hang" (holds each
request `hang_s` seconds or until the server stops, then drops the connection unanswered),
"deferred" (deletes are accepted, 200, but nothing is removed: Langfuse deletes in the
background, so traces stay listed for a while), "unfiltered" (the observation listing ignores
`sessionId`, as a server that does not know the filter would).

Also here: `HangingServer` (accepts TCP connections, never answers): Langfuse, or any HTTP
service, hanging. The server machinery is the fake LLM's (memory_core/devservices/fake_llm.py).
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import socket
import uuid
import zlib
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from memory_core.devservices.fake_llm import JSONHandler, LocalServer, _HTTPServer

MODES = ("served", "401", "404", "500")
TRACE_API_MODES = ("ok", "500", "401", "hang", "deferred", "unfiltered")
SESSION_ATTRIBUTE = "session.id"  # what propagate_attributes(session_id=...) sets on spans
TRACE_NAME_ATTRIBUTE = "langfuse.trace.name"
PROJECT_ID = "fake-project"

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
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "start_time_unix_nano": span.start_time_unix_nano,
                        "end_time_unix_nano": span.end_time_unix_nano,
                    }
                )
    return spans


class _Handler(JSONHandler):
    server: _HTTPServer  # its owner is the FakeLangfuseServer (LocalServer)

    def do_GET(self) -> None:
        owner: FakeLangfuseServer = self.server.owner
        path = urlsplit(self.path).path
        if path in ("/api/public/v2/observations", "/api/public/traces"):
            self._trace_api("GET", path, b"")
            return
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

    def do_DELETE(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        if path == "/api/public/traces" or path.startswith("/api/public/traces/"):
            self._trace_api("DELETE", path, raw)
        else:
            self.send_json(404, {"message": f"no route {path}"})

    # ------------------------------------------------------------------ the trace API

    def _trace_api(self, method: str, path: str, raw: bytes) -> None:
        owner: FakeLangfuseServer = self.server.owner
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        with owner.lock:
            owner.trace_requests.append(
                {"method": method, "path": path, "query": query, "body": _json_or_none(raw)}
            )
            mode = owner.trace_api_mode
        if mode == "hang":
            owner.stopping.wait(owner.hang_s)
            self.close_connection = True  # drop it unanswered: Langfuse never replied
            return
        if mode == "401" or not headers.get("authorization", "").startswith("Basic "):
            message = "Invalid credentials. Confirm that you've configured the correct host."
            self.send_json(401, {"message": message})
        elif mode == "500":
            self.send_json(500, {"message": "Internal Server Error", "error": "Unknown error"})
        elif method == "GET" and path == "/api/public/v2/observations":
            if mode == "unfiltered":
                query.pop("sessionId", None)
            status, payload = owner.observations_page(query)
            self.send_json(status, payload)
        elif method == "GET":
            status, payload = owner.traces_page(query)
            self.send_json(status, payload)
        elif path == "/api/public/traces":
            body = _json_or_none(raw)
            ids = body.get("traceIds") if isinstance(body, dict) else None
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                self.send_json(400, {"message": "Invalid request data", "error": "traceIds"})
                return
            owner.delete_traces(ids, deferred=mode == "deferred")
            self.send_json(200, {"message": "Traces deleted"})
        else:
            trace_id = unquote(path[len("/api/public/traces/") :])
            owner.delete_traces([trace_id], deferred=mode == "deferred")
            self.send_json(200, {"message": "Trace deleted"})


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _iso(unix_nano: int) -> str:
    stamp = datetime.fromtimestamp(unix_nano / 1e9, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _int_param(query: dict[str, str], name: str, default: int, low: int, high: int) -> int | None:
    """The query parameter as an int within [low, high], the default when absent, else None."""
    if name not in query:
        return default
    try:
        value = int(query[name])
    except ValueError:
        return None
    return value if low <= value <= high else None


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
        self.trace_api_mode = "ok"
        self.hang_s = 30.0
        self.max_page_size = 1000  # observations per v2 page, whatever `limit` asks for
        self.trace_requests: list[dict[str, Any]] = []
        self.deleted_trace_ids: list[str] = []

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

    # ------------------------------------------------------------------ the trace API

    def set_trace_api_mode(self, mode: str) -> None:
        if mode not in TRACE_API_MODES:
            raise ValueError(f"unknown trace API mode {mode!r}; one of {TRACE_API_MODES}")
        with self.lock:
            self.trace_api_mode = mode

    def add_trace(
        self,
        trace_id: str | None = None,
        session_id: str | None = None,
        *,
        name: str = "seeded-trace",
        observations: int = 1,
    ) -> str:
        """Seed a trace (as if exported) of `observations` spans; returns its id."""
        trace_id = trace_id or uuid.uuid4().hex
        now = datetime.now(UTC).timestamp()
        root = uuid.uuid4().hex[:16]
        spans = []
        for n in range(observations):
            attributes: dict[str, Any] = {
                "langfuse.observation.type": "span",
                TRACE_NAME_ATTRIBUTE: name,
            }
            if session_id is not None:
                attributes[SESSION_ATTRIBUTE] = session_id
            start = int((now + n / 1000) * 1e9)
            spans.append(
                {
                    "name": name if n == 0 else f"{name}-child-{n}",
                    "trace_id": trace_id,
                    "span_id": root if n == 0 else uuid.uuid4().hex[:16],
                    "scope": "seeded",
                    "scope_attributes": {},
                    "attributes": attributes,
                    "parent_span_id": None if n == 0 else root,
                    "start_time_unix_nano": start,
                    "end_time_unix_nano": start + 1_000_000,
                }
            )
        with self.lock:
            self.spans.extend(spans)
        return trace_id

    def traces(self) -> dict[str, dict[str, Any]]:
        """Trace id -> {id, session_id, name, timestamp (unix ns), spans}, oldest first."""
        with self.lock:
            spans = list(self.spans)
        traces: dict[str, dict[str, Any]] = {}
        for span in sorted(spans, key=lambda s: (s["start_time_unix_nano"], s["span_id"])):
            attrs = span["attributes"]
            trace = traces.setdefault(
                span["trace_id"],
                {
                    "id": span["trace_id"],
                    "session_id": None,
                    "name": None,
                    "timestamp": span["start_time_unix_nano"],
                    "spans": [],
                },
            )
            trace["spans"].append(span)
            if trace["session_id"] is None and attrs.get(SESSION_ATTRIBUTE) is not None:
                trace["session_id"] = str(attrs[SESSION_ATTRIBUTE])
            if trace["name"] is None and span["parent_span_id"] is None:
                trace["name"] = attrs.get(TRACE_NAME_ATTRIBUTE) or span["name"]
        return traces

    def trace_ids(self, session_id: str | None = None) -> list[str]:
        """Ids of the stored traces (of one session when given), oldest first."""
        return [
            t["id"]
            for t in self.traces().values()
            if session_id is None or t["session_id"] == session_id
        ]

    def delete_traces(self, trace_ids: list[str], *, deferred: bool = False) -> None:
        doomed = set(trace_ids)
        with self.lock:
            self.deleted_trace_ids.extend(trace_ids)
            if not deferred:
                self.spans = [s for s in self.spans if s["trace_id"] not in doomed]

    def trace_api_calls(self, method: str, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.trace_requests if r["method"] == method and r["path"] == path]

    def _observation(self, span: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
        attrs = span["attributes"]
        end = span.get("end_time_unix_nano")
        return {
            "id": span["span_id"],
            "traceId": span["trace_id"],
            "startTime": _iso(span["start_time_unix_nano"]),
            "endTime": _iso(end) if end else None,
            "projectId": PROJECT_ID,
            "parentObservationId": span["parent_span_id"],
            "type": str(attrs.get("langfuse.observation.type") or "span").upper(),
            "isRootObservation": span["parent_span_id"] is None,
            "name": span["name"],
            "level": attrs.get("langfuse.observation.level") or "DEFAULT",
            "statusMessage": attrs.get("langfuse.observation.status_message"),
            "version": None,
            "environment": attrs.get("langfuse.environment") or "default",
            "bookmarked": False,
            "public": False,
            "userId": attrs.get("user.id"),
            "sessionId": trace["session_id"],
        }

    def observations_page(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """`GET /api/public/v2/observations`: (status, body), cursor-paginated."""
        limit = _int_param(query, "limit", 50, 1, 1000)
        if limit is None:
            return 400, {"message": "Invalid request data", "error": "limit"}
        offset = 0
        if query.get("cursor"):
            try:
                offset = int(json.loads(base64.b64decode(query["cursor"]))["offset"])
            except (ValueError, KeyError, TypeError):
                return 400, {"message": "Invalid cursor", "error": "cursor"}
        rows = [
            (span, trace)
            for trace in self.traces().values()
            if query.get("sessionId") in (None, trace["session_id"])
            and query.get("traceId") in (None, trace["id"])
            for span in trace["spans"]
        ]
        rows.sort(key=lambda r: (-r[0]["start_time_unix_nano"], r[0]["span_id"]))  # newest first
        size = min(limit, self.max_page_size)
        page = rows[offset : offset + size]
        meta: dict[str, Any] = {}
        if offset + size < len(rows):
            meta["cursor"] = base64.b64encode(
                json.dumps({"offset": offset + size}).encode()
            ).decode()
        return 200, {"data": [self._observation(s, t) for s, t in page], "meta": meta}

    def traces_page(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """`GET /api/public/traces` (legacy): (status, body), page-numbered."""
        page = _int_param(query, "page", 1, 1, 10**9)
        limit = _int_param(query, "limit", 50, 1, 100)
        if page is None or limit is None:
            return 400, {"message": "Invalid request data", "error": "page/limit"}
        traces = [
            t for t in self.traces().values() if query.get("sessionId") in (None, t["session_id"])
        ]
        traces.sort(key=lambda t: (-t["timestamp"], t["id"]))  # newest first, like Langfuse
        chunk = traces[(page - 1) * limit : page * limit]
        data = [
            {
                "id": t["id"],
                "timestamp": _iso(t["timestamp"]),
                "name": t["name"],
                "input": None,
                "output": None,
                "sessionId": t["session_id"],
                "release": None,
                "version": None,
                "userId": None,
                "metadata": None,
                "tags": [],
                "public": False,
                "environment": "default",
                "htmlPath": f"/project/{PROJECT_ID}/traces/{t['id']}",
                "latency": 0.0,
                "totalCost": 0.0,
                "observations": [s["span_id"] for s in t["spans"]],
                "scores": [],
            }
            for t in chunk
        ]
        meta = {
            "page": page,
            "limit": limit,
            "totalItems": len(traces),
            "totalPages": math.ceil(len(traces) / limit),
        }
        return 200, {"data": data, "meta": meta}


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
