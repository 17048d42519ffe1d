"""The inspector's ASGI application (Starlette): its routes, the basic auth and the access log.

Read-only: every route is a GET and reads through reads.py. Every page comes from a Jinja2
template with autoescaping on, so stored text (a query holding `<script>`) shows as text, and
the Content-Security-Policy allows no script at all and no origin but this one: the page has
none to run and loads nothing from elsewhere.

Auth is HTTP basic, as Flower's: one `user:password`, compared in constant time. `/healthz` is
the only route without it (for probes; it shows no content). Each request logs one
`inspector.access` line: the route, the thread id when the route has one, the user name and the
status; never a query string (an owner id) nor content.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import secrets
import uuid
from dataclasses import asdict
from datetime import datetime
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.copy.cache_state import CACHE_ERRORS, describe_cache_error
from memory_core.copy.views import FOCUSES
from memory_core.inspector.reads import (
    MAX_VIEW_TOKENS,
    ThreadPage,
    find_threads,
    read_thread,
    thread_owner,
)
from memory_core.io.db import describe_db_error
from memory_core.logs import log_event

ACCESS_LOGGER = "memory_core.inspector.access"
DEFAULT_MAX_TOKENS = 2000
REALM = "agent-memory inspector"
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),  # pages hold content: no copy in a browser cache
]
_THREAD_PATH = re.compile(r"^/(api/)?threads/([^/]+)/?$")
_access = logging.getLogger(ACCESS_LOGGER)


class BadRequest(ValueError):
    """A parameter the page cannot use: 400 with this message (it names no stored content)."""


def parse_auth(value: str) -> tuple[str, str]:
    """`user:password` into its two parts; ValueError when either is missing."""
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError("MEMORY_INSPECTOR_AUTH must be user:password")
    return user, password


class BasicAuth:
    """Pure ASGI middleware: basic auth on every route but /healthz, the security headers on
    every response, and the access line once the status is known."""

    def __init__(self, app: ASGIApp, *, user: str, password: str) -> None:
        self.app = app
        self._user = user.encode()
        self._password = password.encode()

    def _user_of(self, scope: Scope) -> str | None:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"basic":
                    return None
                try:
                    user, _, password = base64.b64decode(token.strip(), validate=True).partition(
                        b":"
                    )
                except (binascii.Error, ValueError):
                    return None
                ok_user = secrets.compare_digest(user, self._user)
                ok_password = secrets.compare_digest(password, self._password)
                return self._user.decode() if ok_user and ok_password else None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        user = self._user_of(scope)
        status = 0

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        if path == "/healthz":
            await self.app(scope, receive, send_with_headers)
            return
        if user is None:
            response = Response(
                "authentication required\n",
                status_code=401,
                headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
                media_type="text/plain",
            )
            await response(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)
        _log_access(scope, path, user, status)


def _log_access(scope: Scope, path: str, user: str | None, status: int) -> None:
    route = path if path in ("/", "/static/inspector.css") else "other"
    thread_id = ""
    if found := _THREAD_PATH.match(path):
        route = "/api/threads/{id}" if found.group(1) else "/threads/{id}"
        thread_id = _thread_id_or_blank(found.group(2))
    log_event(
        _access,
        logging.INFO,
        "inspector.access",
        method=scope.get("method", ""),
        route=route,
        thread_id=thread_id,
        user=user or "",
        status=status,
    )


def _thread_id_or_blank(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return ""  # not an id: whatever was typed there is not logged


def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("memory_core.inspector", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = lambda d: "" if d is None else d.strftime("%Y-%m-%d %H:%M:%S %Z")
    return env


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def page_json(page: ThreadPage) -> dict[str, Any]:
    """The /api/threads/{id} document: the page's data, as plain JSON."""
    return {
        "thread": {
            "id": str(page.thread_id),
            "owner_id": page.owner_id,
            "title": page.title,
            "agent_type": page.agent_type,
            "is_archived": page.is_archived,
            "created_at": page.created_at,
            "updated_at": page.updated_at,
            "turn_count": page.turn_count,
        },
        "summary": page.summary,  # as stored: None before the first fold
        "summary_size": {"tokens": page.summary_tokens, "bound": page.summary_bound},
        "standing_instructions": page.standing_instructions,
        "turns": [asdict(t) for t in page.turns],
        "max_tokens": page.max_tokens,
        "views": {focus: asdict(view) for focus, view in page.views.items()},
        "fold": page.fold,
        "working_copy": page.copy,
        "events": [
            {"id": e.id, "at": e.at, "event": e.event, "fields": e.fields} for e in page.events
        ],
        "events_error": page.events_error,
    }


def _thread_id(request: Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.path_params["thread_id"])
    except ValueError:
        raise BadRequest("not a thread id (a UUID)") from None


def _max_tokens(request: Request) -> int:
    raw = request.query_params.get("max_tokens", "")
    if not raw:
        return DEFAULT_MAX_TOKENS
    if not raw.isdigit() or not 0 <= int(raw) <= MAX_VIEW_TOKENS:
        raise BadRequest(f"max_tokens must be a whole number from 0 to {MAX_VIEW_TOKENS}")
    return int(raw)


def create_app(memory: RedisConversationMemory, *, auth: str) -> Starlette:
    """The inspector on `memory`'s Postgres and Redis, behind basic auth `user:password`."""
    user, password = parse_auth(auth)
    env = _templates()
    css = resources.files("memory_core.inspector").joinpath("static/inspector.css").read_bytes()

    def html(name: str, code: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**context), status_code=code)

    def error(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status)
        return html("error.html", status, status=status, message=message)

    def guarded(endpoint: Any) -> Any:
        def run(request: Request) -> Response:
            try:
                return endpoint(request)
            except BadRequest as exc:
                return error(request, 400, str(exc))
            except (DBAPIError, SQLAlchemyError) as exc:
                return error(request, 503, f"Postgres did not answer: {describe_db_error(exc)}")

        return run

    def index(request: Request) -> Response:
        owner = request.query_params.get("owner", "").strip()
        wanted = request.query_params.get("id", "").strip()
        rows: list[Any] = []
        searched = bool(owner or wanted)
        if wanted:
            try:
                found = thread_owner(memory, uuid.UUID(wanted))
            except ValueError:
                raise BadRequest("not a thread id (a UUID)") from None
            rows = [found] if found else []
        elif owner:
            rows = find_threads(memory, owner)
        return html("index.html", rows=rows, owner=owner, wanted=wanted, searched=searched)

    def thread(request: Request) -> Response:
        page = read_thread(memory, _thread_id(request), _max_tokens(request))
        if page is None:
            return error(request, 404, "no such thread: it never existed, or it was deleted")
        return html("thread.html", page=page, focuses=FOCUSES)

    def api_thread(request: Request) -> Response:
        page = read_thread(memory, _thread_id(request), _max_tokens(request))
        if page is None:
            return error(request, 404, "no such thread: it never existed, or it was deleted")
        body = json.dumps(page_json(page), default=_json_default, ensure_ascii=False)
        return Response(body, media_type="application/json")

    def healthz(request: Request) -> Response:
        checks = {"postgres": "ok", "redis": "ok"}
        try:
            with memory.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except (DBAPIError, SQLAlchemyError) as exc:
            checks["postgres"] = describe_db_error(exc)
        try:
            memory.redis.ping()
        except CACHE_ERRORS as exc:
            checks["redis"] = describe_cache_error(exc)
        # Postgres is the canon the pages read; without Redis only the events are missing.
        status = 200 if checks["postgres"] == "ok" else 503
        return JSONResponse({"status": "ok" if status == 200 else "down", **checks}, status)

    def stylesheet(request: Request) -> Response:
        return Response(css, media_type="text/css")

    routes = [
        Route("/", guarded(index)),
        Route("/threads/{thread_id}", guarded(thread)),
        Route("/api/threads/{thread_id}", guarded(api_thread)),
        Route("/healthz", healthz),
        Route("/static/inspector.css", stylesheet),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(BasicAuth, user=user, password=password)
    return app
