"""A real browser on the inspector: Debian's headless Chromium renders a thread page served by
`agent-memory inspect serve`, with a turn that tries to run script."""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path

import pytest

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from tests.support.inspector import AUTH, InspectorServer, browse, chromium, folded_thread
from tests.support.snapshots import make_snapshot

ATTACK = (
    "<script>document.title='owned'</script>"
    '<img src=x onerror="document.body.dataset.owned=1"> revenue by region'
)


@pytest.fixture(scope="module")
def browser() -> str:
    found = chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium not found: .ci/run installs Debian's chromium package")
        pytest.skip("chromium not found (apt-get install chromium)")
    return found


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_chromium_renders_a_thread_page_and_runs_none_of_its_text(
    browser: str, tmp_path: Path
) -> None:
    mem = RedisConversationMemory()
    owner = f"browser-{uuid.uuid4().hex[:6]}"
    tid = folded_thread(mem, owner)
    out = save_session_to_thread_safe(
        make_snapshot(tid, 22, owner_id=owner, user_query=ATTACK), memory=mem
    )
    assert out.status == "saved"
    server = InspectorServer()
    try:
        base = f"http://{AUTH}@127.0.0.1:{server.port}"
        shot = tmp_path / "thread.png"
        dom = browse(f"{base}/threads/{tid}", tmp_path, screenshot=shot)
        assert "<title>Revenue by region for 2001" in dom, dom[:400]
        assert "owned" not in dom.split("</title>", 1)[0]
        assert "data-owned" not in dom and "<img" not in dom
        assert "&lt;script&gt;document.title='owned'&lt;/script&gt;" in dom
        assert 'id="standing"' in dom and 'id="view-brief"' in dom and 'id="turn-22"' in dom
        assert _png_size(shot) == (1280, 2000)
        assert shot.stat().st_size > 30_000  # a page of text, not a blank or an error
        if target := os.environ.get("INSPECTOR_SCREENSHOT"):  # docs/inspector-thread.png
            shutil.copy(shot, target)
        refused = browse(f"http://127.0.0.1:{server.port}/threads/{tid}", tmp_path)
        assert "Revenue" not in refused and "owned" not in refused  # it asks, shows nothing
    finally:
        assert server.stop() == ""
    lines = server.access_lines()
    assert any(line["thread_id"] == str(tid) and line["status"] == 200 for line in lines)
    assert any(line["route"] == "/static/inspector.css" and line["status"] == 200 for line in lines)
    assert any(line["thread_id"] == str(tid) and line["status"] == 401 for line in lines)
