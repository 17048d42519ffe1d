"""The inspector's pages against hostile stored text, and with Postgres or Redis down.

The application runs in-process (Starlette's test client speaks ASGI to it) on the suite's real
Postgres and Redis; the pages are parsed as a browser's tokenizer would read them. Whatever a
turn holds, the page's elements are the templates' own, no attribute is an event handler, and
each piece of text reads back exactly as stored.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine
from starlette.testclient import TestClient

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.ports import free_port
from memory_core.inspector.app import create_app
from tests.support.inspector import AUTH, PASSWORD, USER, folded_thread
from tests.support.snapshots import make_snapshot

# Every element the templates write; an injected one would be a tag outside this set.
TEMPLATE_TAGS = {
    *("html", "head", "meta", "title", "link", "body", "header", "a", "form", "label", "input"),
    *("button", "main", "footer", "p", "table", "thead", "tbody", "tr", "th", "td", "h1", "h2"),
    *("h3", "span", "code", "section", "div", "ul", "li", "pre", "strong", "article"),
}
FRAGMENTS = [
    "<script>document.title='owned'</script>",
    '<img src=x onerror="alert(1)">',
    "</pre><h1>forged</h1><pre>",
    "</textarea></title><svg onload=alert(1)>",
    '" onmouseover="alert(1)" x="',
    "{{ 7*7 }}{% raw %}",
    "&lt;already&gt; &amp; &#39;",
    "<!-- comment --><![CDATA[x]]>",
    "javascript:alert(1)",
    "\u202e\u200bright-to-left",
]
hostile = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(min_size=1, max_size=30)),
    min_size=1,
    max_size=4,
).map(" ".join)


class Page(HTMLParser):
    """Tags, attributes and the text of the elements the tests look at, as a browser reads."""

    def __init__(self, body: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: dict[str, list[str]] = {}
        self._open: list[str] = []
        self.feed(body)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        found = dict(attrs)
        key = found.get("id") or found.get("class") or ""
        if tag in ("p", "pre", "h1", "li", "td") and key:
            self.text.setdefault(f"{tag}.{key}", []).append("")
            self._open.append(f"{tag}.{key}")
        elif tag in ("p", "pre", "h1", "li", "td"):
            self._open.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("p", "pre", "h1", "li", "td") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._open and self._open[-1]:
            self.text[self._open[-1]][-1] += data


def _client(memory: RedisConversationMemory) -> TestClient:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    app = create_app(memory, auth=AUTH)
    return TestClient(app, headers={"Authorization": f"Basic {token}"})


@pytest.fixture(scope="module")
def mem() -> RedisConversationMemory:
    return RedisConversationMemory()


@pytest.fixture(scope="module")
def client(mem: RedisConversationMemory) -> Iterator[TestClient]:
    with _client(mem) as c:
        yield c


def _assert_only_template_markup(page: Page) -> None:
    assert {tag for tag, _ in page.tags} <= TEMPLATE_TAGS
    for _tag, attrs in page.tags:
        for name, value in attrs:
            assert not name.startswith("on"), name
            if name in ("href", "src", "action"):
                assert (value or "").startswith("/"), value


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.tuples(hostile, hostile, hostile, hostile))
def test_hostile_turns_show_as_text(
    client: TestClient, mem: RedisConversationMemory, texts: tuple[str, str, str, str]
) -> None:
    query, answer, sql, chart = texts
    tid, owner = uuid.uuid4(), f"hostile-{uuid.uuid4().hex[:6]}"
    snap = make_snapshot(tid, 1, owner_id=owner, user_query=query, answer=answer, sql=[sql])
    snap["visualizations"][0]["name"] = chart
    out = save_session_to_thread_safe(snap, memory=mem)
    assume(out.status == "saved")  # a snapshot the memory refuses is not stored, nor shown
    stored = client.get(f"/api/threads/{tid}").json()
    turn = stored["turns"][0]
    for path in (f"/threads/{tid}", f"/?owner={owner}", f"/?id={tid}"):
        r = client.get(path)
        assert r.status_code == 200
        page = Page(r.text)
        _assert_only_template_markup(page)
        if path.startswith("/threads/"):
            assert page.text["p.query"] == [turn["user_query"]]
            assert page.text["pre.answer"] == ([turn["answer"]] if turn["answer"] else [])
            assert page.text["pre.sql"] == [a["sql"] for a in turn["artifacts"] if "sql" in a]
            assert page.text["h1.title"] == [stored["thread"]["title"] or "(untitled)"]
            views = stored["views"]
            assert [page.text["pre.text"][i] for i in (-3, -2, -1)] == [
                views[f]["text"] for f in ("brief", "sql", "visualizations")
            ]


@given(owner=st.text(max_size=300), wanted=st.text(max_size=60), budget=st.text(max_size=12))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_hostile_query_strings_get_a_page_or_a_clear_400(
    client: TestClient, owner: str, wanted: str, budget: str
) -> None:
    for params in ({"owner": owner}, {"id": wanted}, {"owner": owner, "id": wanted}):
        r = client.get("/", params=params)
        assert r.status_code in (200, 400)
        _assert_only_template_markup(Page(r.text))
    r = client.get(f"/threads/{uuid.uuid4()}", params={"max_tokens": budget})
    assert r.status_code in (400, 404)
    _assert_only_template_markup(Page(r.text))


def _closed_port() -> int:
    return free_port()  # free: nothing listens there


def test_with_redis_down_the_page_still_shows_the_canon(mem: RedisConversationMemory) -> None:
    tid = folded_thread(mem, owner := f"no-redis-{uuid.uuid4().hex[:6]}", turns=3)
    dead = redis.Redis(port=_closed_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    down = RedisConversationMemory(dead, engine=mem.engine)
    with _client(down) as c:
        r = c.get(f"/threads/{tid}")
        assert r.status_code == 200 and "(turn 3)" in r.text
        assert "events unavailable: ConnectionError" in r.text
        doc = c.get(f"/api/threads/{tid}").json()
        assert doc["working_copy"].startswith("unavailable: ConnectionError")
        assert [t["seq"] for t in doc["turns"]] == [1, 2, 3]
        assert str(tid) in c.get("/", params={"owner": owner}).text
        health = c.get("/healthz")
        assert health.status_code == 200 and health.json()["redis"].startswith("ConnectionError")


def test_with_postgres_down_every_page_is_a_503_in_one_line(mem: RedisConversationMemory) -> None:
    engine = create_engine(
        f"postgresql+psycopg2://u:p@127.0.0.1:{_closed_port()}/x",
        connect_args={"connect_timeout": 2},
    )
    down = RedisConversationMemory(mem.redis, engine=engine)
    with _client(down) as c:
        for path in ("/?owner=someone", f"/?id={uuid.uuid4()}", f"/threads/{uuid.uuid4()}"):
            r = c.get(path)
            assert r.status_code == 503, path
            message: Any = Page(r.text).text["p.error"]
            assert message[0].startswith("503: Postgres did not answer: OperationalError")
            assert "u:p" not in r.text and "Traceback" not in r.text
        api = c.get(f"/api/threads/{uuid.uuid4()}")
        assert api.status_code == 503 and api.json()["error"].startswith("Postgres did not")
        health = c.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "down"
    engine.dispose()
