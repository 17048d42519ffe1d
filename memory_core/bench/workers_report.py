"""What `agent-memory bench workers` prints: one broker's table with verdicts, or several
brokers side by side (the median of their runs, then every run)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from statistics import median

from memory_core.bench.bench_worker import NOOP_TASK
from memory_core.bench.broker_adapters import BROKER_NAMES, without_credentials
from memory_core.bench.common import machine

COMMAND = "agent-memory bench workers"
# The folds compared for prompt growth; LangChain's summary buffer's LLM calls per 100 turns.
EARLY, LATE, LANGCHAIN_CALLS = 30, 300, 80


def early_late(folds: dict[int, int]) -> tuple[int, int]:
    """The turns of the folds nearest EARLY and LATE (the earlier one on a tie)."""
    early = min(folds, key=lambda t: (abs(t - EARLY), t))
    late = min(folds, key=lambda t: (abs(t - LATE), t))
    return early, late


def enqueue_how(kind: str) -> str:
    """How the bench enqueued on this kind of broker (it differs: say which)."""
    how = (
        "pipelined LPUSH"
        if kind == "redis"
        else "basic.publish on one channel, one wait for the batch's publisher confirms"
    )
    return f"enqueue (one batch per round, {how})"


def invariants(r: dict[str, float], jobs: int) -> str:
    """The checks of a sound run: every job landed, none left on the broker."""
    return (
        f"enqueue {r['enqueue.jobs_s']:,.0f} jobs/s · an idle worker's first job of a round "
        f"after {r['pickup_ms.p50']:.0f} ms (p50; max {r['pickup_ms.max']:.0f}) · landed: finalize "
        f"{r['jobs.finalized']:.0f}/{jobs}, no-op {r['jobs.noop_done']:.0f}/{jobs} · left on "
        f"the broker after the run: {r['broker.left']:.0f}"
    )


def command_line(specs: Sequence[str], jobs: int, repeat: int) -> str:
    """The command that repeats this comparison, without the brokers' credentials."""
    names = [s for s in specs if s in BROKER_NAMES]
    flags = f" --jobs {jobs}" if jobs != 2000 else ""
    flags += f" --brokers {','.join(names)}" if names else ""
    flags += "".join(
        f" --broker-url {without_credentials(s)}" for s in specs if s not in BROKER_NAMES
    )
    flags += f" --repeat {repeat}" if repeat != 1 else ""
    return COMMAND + flags


def run_line(n: int, repeat: int, spec: str, r: dict[str, float], jobs: int) -> str:
    """The line each run of `bench_workers_brokers` prints as it ends."""
    return (
        f"run {n + 1}/{repeat} {without_credentials(spec)}: finalize "
        f"{r['finalize.jobs_s']:,.0f}/s, no-op {r['noop.jobs_s']:,.0f}/s, "
        f"{r['finalize.ratio']:.2f}x; "
        f"{invariants(r, jobs)} · wall {r['wall_s']:.1f} s"
    )


def brokers_header(meta: dict[str, str], *, jobs: int, repeat: int, wall_s: float) -> list[str]:
    """The lines under the command of the side-by-side table (`meta`: the first broker's)."""
    return [
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · jobs={jobs} per run over "
        f"{meta['threads']} threads · {repeat} run(s) per broker, alternating · wall "
        f"{wall_s:.0f} s",
        f"{machine()} · {meta['versions'].split('; broker ')[0]}",
        f"worker: {meta['worker']}; folds call a local fake OpenAI-compatible LLM that "
        "answers at once",
    ]


_ROWS: tuple[tuple[str, str, str], ...] = (
    ("finalize.jobs_s", "finalize jobs/s through the worker", "{:,.0f}"),
    ("noop.jobs_s", f"`{NOOP_TASK}` jobs/s (same payloads, worker and queue)", "{:,.0f}"),
    ("finalize.ratio", "finalize / no-op (goal >= 0.60x)", "{:.2f}x"),
    ("finalize.jobs_s_with_folds", "finalize jobs/s until the folds also drained", "{:,.0f}"),
    (
        "finalize.jobs_s_from_pickup",
        "finalize jobs/s, rounds timed from the first pickup",
        "{:,.0f}",
    ),
    ("noop.jobs_s_from_pickup", "no-op jobs/s, rounds timed from the first pickup", "{:,.0f}"),
    (
        "finalize.ratio_from_pickup",
        "finalize / no-op, rounds timed from the first pickup",
        "{:.2f}x",
    ),
    ("enqueue.jobs_s", "enqueue jobs/s (the bench's batches)", "{:,.0f}"),
    ("pickup_ms.p50", "idle worker: first job of a round received after (ms, p50)", "{:.0f}"),
    ("pickup_ms.max", "idle worker: first job of a round received after (ms, max)", "{:.0f}"),
    ("finalize.folds", "folds that ran", "{:.0f}"),
    ("task.finalize_turn_p50_ms", "finalize, time inside the task p50 (ms)", "{:.1f}"),
    ("task.fold_thread_p50_ms", "fold, time inside the task p50 (ms)", "{:.1f}"),
    ("task.bench_noop_p50_ms", "no-op, time inside the task p50 (ms)", "{:.2f}"),
    ("broker.left", "jobs left on the broker after the run", "{:.0f}"),
)


def side_by_side(
    runs: dict[str, list[dict[str, float]]],
    metas: dict[str, dict[str, str]],
    first: dict[str, float],
    *,
    command: str,
    header: list[str],
) -> list[str]:
    """The brokers' figures side by side: the median of the runs, then every run in order."""
    specs = list(runs)
    lines = [f"$ {command}", *header]
    for spec in specs:
        meta = metas[spec]
        label = without_credentials(spec)
        lines.append(f"{label}: {meta['where']}, {meta['broker']}; {enqueue_how(meta['kind'])}")
    n = len(next(iter(runs.values())))
    lines += [
        "",
        f"| figure ({'median of ' + str(n) + ' runs; each run' if n > 1 else 'one run'}) | "
        + " | ".join(without_credentials(spec) for spec in specs)
        + " |",
        "|---|" + "--:|" * len(specs),
    ]
    for key, label, fmt in _ROWS:
        cells = []
        for spec in specs:
            values = [r[key] for r in runs[spec]]
            cell = fmt.format(median(values))
            if n > 1:
                cell += " (" + ", ".join(fmt.format(v) for v in values) + ")"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    calls, prm = first["llm_calls_100_turns"], first["prompt.ratio"]
    lines += [
        "",
        f"Same for every broker (in-process, measured once): LLM calls for a 100-turn thread "
        f"{calls:.0f} (goal 8, {'PASS' if calls == 8 else 'MISS'}); fold prompt tokens late vs "
        f"early {first['prompt.tokens_late']:,.0f} vs {first['prompt.tokens_early']:,.0f} "
        f"({prm:.2f}x, flat <= 1.10x, {'PASS' if prm <= 1.1 else 'MISS'})",
    ]
    return lines


def report(
    r: dict[str, float],
    *,
    folds: dict[int, int],
    calls: int,
    jobs: int,
    broker_url: str,
    n_threads: int,
    header: str,
    worker_command: str,
) -> list[str]:
    """The table `agent-memory bench workers` prints, verdicts included."""
    early, late = early_late(folds)
    fold_turns = ", ".join(str(t) for t in sorted(folds) if t <= 100)
    fin, prm = r["finalize.ratio"], r["prompt.ratio"]
    flag = "" if jobs == 2000 else f" --jobs {jobs}"
    flag += f" --broker-url {without_credentials(broker_url)}"
    lines = [
        f"$ {COMMAND}{flag}",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · jobs={jobs} over {n_threads} threads "
        f"· wall {r['wall_s']:.1f} s",
        header,
        f"worker: {worker_command}; folds call a local fake OpenAI-compatible LLM that "
        "answers at once",
        "",
        "| figure | value | raw limit / reference (same run) | value | ratio | goal | verdict |",
        "|---|--:|---|--:|--:|---|---|",
        f"| finalize jobs through the worker ({r['finalize.folds']:.0f} folds ran) "
        f"| {r['finalize.jobs_s']:,.0f}/s | `{NOOP_TASK}`: same payloads, worker and queue "
        f"| {r['noop.jobs_s']:,.0f}/s | {fin:.2f}x | >= 0.60x "
        f"| {'PASS' if fin >= 0.6 else 'MISS'} |",
        f"| LLM calls for a 100-turn thread (folds at turns {fold_turns}) | {calls} "
        f"| LangChain ConversationSummaryBufferMemory (reference, not run) | {LANGCHAIN_CALLS} "
        f"| {calls / LANGCHAIN_CALLS:.2f}x | 8 | {'PASS' if calls == 8 else 'MISS'} |",
        f"| fold prompt tokens, fold at turn {late} | {folds[late]:,} | the same thread's fold "
        f"at turn {early} | {folds[early]:,} | {prm:.2f}x | flat (<= 1.10x) "
        f"| {'PASS' if prm <= 1.1 else 'MISS'} |",
        "",
        f"finalize until the fold backlog also drained: {r['finalize.jobs_s_with_folds']:,.0f}/s",
        f"time inside the task (worker log, p50): finalize {r['task.finalize_turn_p50_ms']:.1f} "
        f"ms, fold {r['task.fold_thread_p50_ms']:.1f} ms, no-op {r['task.bench_noop_p50_ms']:.2f} "
        f"ms; folds took {100 * r['task.fold_share']:.0f}% of the finalize side's task time",
    ]
    return lines
