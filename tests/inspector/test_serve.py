"""`agent-memory inspect serve` as an operator runs it: a subprocess on a loopback port, asked
over HTTP, on the suite's Postgres and Redis."""

from __future__ import annotations

import html
import uuid
from collections.abc import Iterator

import pytest

from memory_core import RedisConversationMemory
from memory_core.copy.views import FOCUSES, render_conversation_context
from memory_core.events import MEMORY_SUMMARIZATION_FAILED, emit_event
from memory_core.fold.llm_free import parse_sections
from memory_core.fold.summary_tail import stored_summary_bound
from memory_core.lifecycle.threads import archive_thread, delete_thread
from memory_core.tokens import count_tokens
from tests.support.commands import run_module
from tests.support.inspector import PASSWORD, USER, InspectorServer, folded_thread

pytestmark = pytest.mark.usefixtures("settings_agree")

OWNER = f"inspector-owner-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def mem() -> RedisConversationMemory:
    return RedisConversationMemory()


@pytest.fixture(scope="module")
def tid(mem: RedisConversationMemory) -> uuid.UUID:
    return folded_thread(mem, OWNER)


@pytest.fixture(scope="module")
def server(tid: uuid.UUID) -> Iterator[InspectorServer]:
    srv = InspectorServer()
    yield srv
    assert srv.stop() == "", "the inspector printed on stdout"


@pytest.mark.parametrize("auth", ["", "nocolon", ":pw", "user:"])
def test_serve_refuses_without_credentials_in_one_line(auth: str) -> None:
    out = run_module("memory_core.cli", "inspect", "serve", env={"MEMORY_INSPECTOR_AUTH": auth})
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "MEMORY_INSPECTOR_AUTH" in out.stderr, out.stderr
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "auth",
    [
        None,
        (USER, "wrong"),
        ("someone", PASSWORD),
        (USER, PASSWORD + "x"),
        (USER.upper(), PASSWORD),
    ],
)
def test_every_route_but_healthz_asks_for_the_credentials(
    server: InspectorServer, tid: uuid.UUID, auth: tuple[str, str] | None
) -> None:
    for path in ("/", f"/?owner={OWNER}", f"/threads/{tid}", f"/api/threads/{tid}", "/nope"):
        r = server.get(path, auth=auth)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"].startswith("Basic realm=")
        assert "Revenue" not in r.text and OWNER not in r.text
    health = server.get("/healthz", auth=None)
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "postgres": "ok", "redis": "ok"}


@pytest.mark.parametrize("header", ["Basic !!!", "Bearer abc", "Basic", "basic " + "A" * 5000])
def test_a_malformed_authorization_header_is_a_401(server: InspectorServer, header: str) -> None:
    r = server.client.get("/", headers={"Authorization": header})
    assert r.status_code == 401


def test_the_thread_page_shows_the_memory_each_node_gets(
    server: InspectorServer, mem: RedisConversationMemory, tid: uuid.UUID
) -> None:
    ctx = mem.get_context(tid, OWNER)
    standing = parse_sections(ctx.summary)["instructions"]
    assert standing, "the folded thread has standing instructions to show"
    page = server.get(f"/threads/{tid}?max_tokens=700")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    body = page.text
    section = body.split('id="standing"', 1)[1].split("</div>", 1)[0]
    items = [html.unescape(li.split("</li>", 1)[0]) for li in section.split("<li>")[1:]]
    assert items == standing
    bound = stored_summary_bound(mem.settings.memory_summary_max_tokens)
    assert f"{count_tokens(ctx.summary or '')} / {bound} tokens" in body
    for focus in FOCUSES:
        view = render_conversation_context(ctx, focus, 700)
        block = body.split(f'id="view-{focus}"', 1)[1].split("</div>", 1)[0]
        assert f"{count_tokens(view)} / 700 tokens" in block
        shown = block.split('<pre class="text">', 1)[1].split("</pre>", 1)[0]
        assert html.unescape(shown) == view
    for n in (1, 11, 21):  # folded and unfolded turns alike, SQL verbatim
        turn = body.split(f'id="turn-{n}"', 1)[1].split("</article>", 1)[0]
        assert f"Revenue by region for {2000 + n}, excluding returns (turn {n})" in turn
        assert f"WHERE year = {2000 + n} AND NOT is_return GROUP BY region" in turn
    assert "summary through seq</th><td>11 of 21 (10 unfolded" in body
    assert "llm-free:v2" in body and "present, expires in" in body


def test_the_json_has_every_part_of_the_page(
    server: InspectorServer, mem: RedisConversationMemory, tid: uuid.UUID
) -> None:
    ctx = mem.get_context(tid, OWNER)
    for budget in (0, 120, 2000):
        doc = server.get(f"/api/threads/{tid}?max_tokens={budget}").json()
        assert set(doc) >= {"summary", "standing_instructions", "turns", "views", "fold", "events"}
        assert doc["summary"] == ctx.summary
        bound = stored_summary_bound(mem.settings.memory_summary_max_tokens)
        assert doc["summary_size"] == {"tokens": count_tokens(ctx.summary or ""), "bound": bound}
        assert doc["standing_instructions"] == parse_sections(ctx.summary)["instructions"]
        assert [t["seq"] for t in doc["turns"]] == list(range(1, 22))
        assert doc["turns"][4]["user_query"].endswith("(turn 5)")
        assert doc["turns"][4]["artifacts"][0]["kind"] == "sql"
        for focus in FOCUSES:
            view = render_conversation_context(ctx, focus, budget)
            assert doc["views"][focus] == {"text": view, "tokens": count_tokens(view)}
            if budget:
                assert doc["views"][focus]["tokens"] <= budget
        fold = doc["fold"]
        assert (fold["summary_through_seq"], fold["last_seq"], fold["attempts"]) == (11, 21, 0)
        assert fold["prompt_version"] == "llm-free:v2" and fold["lease_until"] is None


def test_the_index_finds_threads_by_owner_and_by_id(
    server: InspectorServer, mem: RedisConversationMemory, tid: uuid.UUID
) -> None:
    other = folded_thread(mem, OWNER, turns=2)
    archive_thread(other, OWNER, memory=mem)
    listed = server.get(f"/?owner={OWNER}").text
    rows = listed.split("<tbody>", 1)[1].split("</tbody>", 1)[0].split("<tr>")[1:]
    by_id = {next(str(t) for t in (tid, other) if str(t) in row): row for row in rows}
    assert set(by_id) == {str(tid), str(other)}
    assert "<td>yes</td>" in by_id[str(other)] and '<td class="n">2</td>' in by_id[str(other)]
    assert "<td>no</td>" in by_id[str(tid)] and '<td class="n">21</td>' in by_id[str(tid)]
    assert "<td>chat</td>" in by_id[str(tid)] and "(turn 1)</a>" in by_id[str(tid)]
    one = server.get(f"/?id={other}").text
    assert str(other) in one and str(tid) not in one
    assert 'id="none"' in server.get("/?owner=nobody-at-all").text
    assert 'id="none"' in server.get(f"/?id={uuid.uuid4()}").text
    bad = server.get("/?id=not-a-uuid")
    assert bad.status_code == 400 and "not a thread id" in bad.text


def test_the_page_shows_the_threads_own_events(
    server: InspectorServer, mem: RedisConversationMemory, tid: uuid.UUID
) -> None:
    mine = emit_event(
        mem.redis, MEMORY_SUMMARIZATION_FAILED, thread_id=str(tid), attempt=3, error="Timeout"
    )
    theirs = emit_event(mem.redis, MEMORY_SUMMARIZATION_FAILED, thread_id=str(uuid.uuid4()))
    assert mine and theirs
    body = server.get(f"/threads/{tid}").text.split('id="events"', 1)[1]
    assert mine in body and theirs not in body
    assert MEMORY_SUMMARIZATION_FAILED in body and "attempt=3" in body and "error=Timeout" in body
    events = server.get(f"/api/threads/{tid}").json()["events"]
    assert events[0]["id"] == mine and events[0]["fields"]["attempt"] == "3"


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/threads/not-a-uuid", 400, "not a thread id"),
        ("/threads/%3Cscript%3E", 400, "not a thread id"),
        ("/api/threads/12345", 400, "not a thread id"),
        ("/threads/{tid}?max_tokens=-1", 400, "max_tokens must be"),
        ("/threads/{tid}?max_tokens=abc", 400, "max_tokens must be"),
        ("/api/threads/{tid}?max_tokens=1000000000", 400, "max_tokens must be"),
        ("/threads/{unknown}", 404, "no such thread"),
        ("/api/threads/{unknown}", 404, "no such thread"),
    ],
)
def test_bad_parameters_get_a_clear_4xx(
    server: InspectorServer, tid: uuid.UUID, path: str, status: int, says: str
) -> None:
    # Ids made here, not in the parameters: xdist's workers must collect the same test ids.
    r = server.get(path.replace("{tid}", str(tid)).replace("{unknown}", str(uuid.uuid4())))
    assert r.status_code == status and says in r.text
    assert "<script" not in r.text and "Traceback" not in r.text
    if path.startswith("/api/"):
        assert says in r.json()["error"]


def test_pages_load_nothing_from_elsewhere_and_run_no_script(
    server: InspectorServer, tid: uuid.UUID
) -> None:
    for path in ("/", f"/?owner={OWNER}", f"/threads/{tid}", "/threads/nope"):
        r = server.get(path)
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp
        assert r.headers["cache-control"] == "no-store"
        assert "<script" not in r.text.lower()
        for attr in ("src=", "href=", "action="):
            for value in r.text.split(attr)[1:]:
                assert value.startswith('"/'), f"{path}: {attr}{value[:40]}"


def test_a_deleted_thread_is_gone_from_the_inspector(
    server: InspectorServer, mem: RedisConversationMemory
) -> None:
    owner = f"inspector-gone-{uuid.uuid4().hex[:6]}"
    gone = folded_thread(mem, owner, turns=3)
    assert server.get(f"/threads/{gone}").status_code == 200
    delete_thread(gone, owner, memory=mem)
    for path in (f"/threads/{gone}", f"/api/threads/{gone}"):
        r = server.get(path)
        assert r.status_code == 404 and "Revenue" not in r.text
    assert str(gone) not in server.get(f"/?owner={owner}").text
    assert str(gone) not in server.get(f"/?id={gone}").text.split("<main>", 1)[1]


def test_each_access_logs_the_thread_id_and_user_never_content(
    server: InspectorServer, tid: uuid.UUID
) -> None:
    server.get(f"/threads/{tid}")
    server.get(f"/?owner={OWNER}")
    server.get("/threads/%3Cb%3Eevil%3C%2Fb%3E")
    server.get(f"/api/threads/{tid}", auth=("intruder", "guess"))
    lines = server.access_lines()
    wanted = {"route": "/threads/{id}", "thread_id": str(tid), "user": USER, "status": 200}
    assert any(wanted.items() <= line.items() for line in lines)
    assert any(line["route"] == "/threads/{id}" and line["thread_id"] == "" for line in lines)
    assert any(line["route"] == "/" and line["thread_id"] == "" for line in lines)
    assert any(line["user"] == "" and line["status"] == 401 for line in lines)
    everything = server.stderr()
    for secret in (OWNER, "Revenue", "is_return", "evil", "intruder", "guess", PASSWORD):
        assert secret not in everything, secret
