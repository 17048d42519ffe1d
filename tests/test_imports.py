"""What a process pays to start: Langfuse's SDK (~0.5 s of imports) is loaded only where a
configured Langfuse is called, or, in a worker, once before the pool forks."""

from __future__ import annotations

from tests.support.commands import run_python

NO_LANGFUSE = {"LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}
LOADED = "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & {'langfuse'}))"


def test_workers_and_commands_without_langfuse_do_not_load_its_sdk() -> None:
    code = "import memory_core, memory_core.cli, workers.tasks, workers.lifecycle_tasks; " + LOADED
    out = run_python("-c", code, env=NO_LANGFUSE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_worker_with_langfuse_loads_it_before_its_pool_forks() -> None:
    keys = {"LANGFUSE_PUBLIC_KEY": "pk-lf-x", "LANGFUSE_SECRET_KEY": "sk-lf-x"}
    code = "import workers.app as a; a._warm_up(); " + LOADED
    out = run_python("-c", code, env=keys)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['langfuse']"
    out = run_python("-c", code, env=NO_LANGFUSE)
    assert out.stdout.strip() == "[]"
