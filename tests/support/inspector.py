"""The memory inspector as an operator runs it: `agent-memory inspect serve` in a subprocess on
a loopback port, asked over HTTP; and headless Chromium pointed at it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.fold.folding import Folder
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.settings import Settings
from tests.support import REPO
from tests.support.snapshots import make_snapshot

USER, PASSWORD = "ops", "pw-7c1e-inspector"
AUTH = f"{USER}:{PASSWORD}"
# Debian's chromium, headless, and nothing that reaches beyond loopback (no update checks,
# no sync, no field trials): the flags of the issue, plus a profile of its own per run.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
)


class InspectorServer:
    """`python -m memory_core.cli inspect serve` on a free loopback port."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, log = tempfile.mkstemp(prefix="inspector-", suffix=".log")
        os.close(fd)
        self._log = Path(log)
        with self._log.open("wb") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    *("-m", "memory_core.cli", "inspect", "serve", "--port", str(self.port)),
                ],
                cwd=REPO,
                env={**os.environ, "MEMORY_INSPECTOR_AUTH": AUTH, **(env or {})},
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.client = httpx.Client(base_url=self.url, timeout=30)
        wait_for(self._up, 60, "the inspector to answer /healthz", self.stderr)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the inspector exited {self.proc.returncode}: {self.stderr()}")
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def get(self, path: str, *, auth: tuple[str, str] | None = (USER, PASSWORD)) -> httpx.Response:
        return self.client.get(path, auth=auth)

    def stderr(self) -> str:
        return self._log.read_text(errors="replace")

    def access_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.stderr().splitlines():
            if line.startswith("{") and '"inspector.access"' in line:
                lines.append(json.loads(line))
        return lines

    def stop(self) -> str:
        """Stop the server; what it printed on stdout (nothing, for a guest)."""
        self.client.close()
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace")


def folded_thread(memory: RedisConversationMemory, owner: str, turns: int = 21) -> uuid.UUID:
    """A thread of `turns` turns, folded LLM-free in-process as a fold worker would (21 turns
    fold the first 11): a stored summary with its standing-instructions section."""
    s = Settings(_env_file=None, openai_base_url=None, openai_api_key=None)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        out = save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
        assert out.status == "saved", out.reason
        if out.fold_published:
            folder.fold(tid)
    return tid


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browse(url: str, out_dir: Path, *, screenshot: Path | None = None) -> str:
    """Chromium's DOM of `url` after it ran (`--dump-dom`), and a screenshot when asked."""
    binary = chromium()
    assert binary, "chromium is not installed (apt-get install chromium)"
    profile = out_dir / f"chromium-profile-{uuid.uuid4().hex[:6]}"
    base = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    if screenshot is not None:
        subprocess.run(
            [*base, f"--screenshot={screenshot}", "--window-size=1280,2000", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    dom = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
    )
    return dom.stdout
