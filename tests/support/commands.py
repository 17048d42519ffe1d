"""Our commands as subprocesses, run from the repository root as a newcomer would run them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m module args` from the repo root, as a newcomer would run it; never raises."""
    return run_python("-m", module, *args, env=env)


def run_python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python args` from the repo root with this environment (+ `env`); never raises."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
