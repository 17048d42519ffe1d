"""The crash scenario's fault injector (tests/reliability/test_crashes.py).

`Chaos` runs two workers and, as the scenario's clock advances, kills their pool children with
-9, freezes a whole worker and kills it with -9, and SIGTERMs another, replacing each worker it
takes down. `Recovery` times how long the finalize jobs at stake in each fault take to land.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress

import redis

from memory_core.devservices.workers import WorkerProcess
from tests.support.state import held_finalize_jobs, landed

# How long a worker's children are frozen before the whole worker is killed: at ~130 jobs/s
# its parent takes its next jobs well within it.
FREEZE_S = 0.5
WHOLE_KILL_TRIES = 5
TASK_LINE = re.compile(
    r"Task memory\.finalize_turn\[([0-9a-f-]+)\] (received|succeeded|retry|raised)"
)


class Recovery:
    """Times how long the finalize jobs at stake in a fault take to land."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, float, set[str]]] = []
        self.done: dict[str, list[float]] = {}

    def at_stake(self, in_flight: set[str]) -> set[str]:
        """In-flight jobs not already being timed for an earlier fault."""
        earlier = set().union(*(sids for _, _, sids in self.pending))
        return in_flight - earlier

    def fault(self, kind: str, at_stake: set[str], at: float) -> None:
        self.pending.append((kind, at, set(at_stake)))
        self.poll()

    def poll(self) -> bool:
        """Move faults whose jobs all landed to `done`; True when nothing is pending."""
        still = []
        for kind, at, sids in self.pending:
            left = sids - landed(sids)
            if left:
                still.append((kind, at, left))
            else:
                self.done.setdefault(kind, []).append(time.monotonic() - at)
        self.pending = still
        return not still


class Chaos:
    """The fault injector: kills children, one whole worker, SIGTERMs another."""

    def __init__(
        self,
        broker: redis.Redis | None,
        start_worker: Callable[..., WorkerProcess],
        env: dict[str, str],
        *,
        whole_kill_at_s: float,
        sigterm_at_s: float,
        task_sessions: dict[str, str] | None = None,
    ) -> None:
        """`broker`: a Redis broker, whose `unacked` hash says which jobs workers hold; None
        for RabbitMQ, which tells no client that: the workers' logs do (jobs received and not
        finished), mapped to session ids by `task_sessions` (task id -> session id)."""
        self.broker = broker
        self.task_sessions = task_sessions if task_sessions is not None else {}
        self.start_worker = start_worker
        self.env = env
        self.whole_kill_at_s, self.sigterm_at_s = whole_kill_at_s, sigterm_at_s
        self.workers = [start_worker(concurrency=2, env=env) for _ in range(2)]
        self.recovery = Recovery()
        self.rng = random.Random(5)
        self.child_kills = 0
        self.whole_kill_held = -1
        self.whole_kills = 0
        self.sigterm_held = -1
        self.sigterm_exit_s = 0.0
        self.timeline: list[tuple[float, str]] = []
        self.threads: list[threading.Thread] = []
        self.sigterm_code: int | None = None

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path}\n{w.log()[-2500:]}" for w in self.workers)

    def step(self, elapsed_s: float) -> None:
        self.recovery.poll()
        victim = None
        if self._whole_kill_due(elapsed_s):
            victim = self._holding_worker() or next(iter(self.live()), None)
        if victim is not None:
            self.kill_whole_worker(victim)
            return
        if self._sigterm_due(elapsed_s):
            # A worker caught holding a job, else (after 5 s of trying) any worker. None may
            # be live for a moment: the whole kills' replacements are still starting.
            live = self.live()
            victim = self._holding_worker()
            if victim is None and live and elapsed_s > self.sigterm_at_s + 5:
                victim = live[0]
            if victim is not None:
                self.sigterm_worker(victim)
                return
        self.kill_a_child()

    def _sigterm_due(self, elapsed_s: float) -> bool:
        return (
            self.sigterm_held < 0
            and self.whole_kills > 0
            and not self._whole_kill_due(elapsed_s)
            and elapsed_s >= self.sigterm_at_s
        )

    def _whole_kill_due(self, elapsed_s: float) -> bool:
        """Until a whole kill took jobs down with it (WHOLE_KILL_TRIES), one is due every 2 s.
        A try catches nothing when the victim took no job while frozen: on a loaded host the
        agents' sends lag and no backlog builds (one CI run had three such tries in a row)."""
        return (
            self.whole_kill_held <= 0
            and self.whole_kills < WHOLE_KILL_TRIES
            and elapsed_s >= self.whole_kill_at_s + 2 * self.whole_kills
        )

    def _holding_worker(self) -> WorkerProcess | None:
        """A live worker whose log shows a finalize job received and not yet finished."""
        for worker in self.live():
            if _unfinished(worker):
                return worker
        return None

    def held(self) -> set[str]:
        """session_ids of the finalize jobs workers hold (taken, not acked)."""
        if self.broker is not None:
            return held_finalize_jobs(self.broker)
        return self._sessions(set().union(*(_unfinished(w) for w in self.workers)))

    def _sessions(self, task_ids: set[str]) -> set[str]:
        return {self.task_sessions[t] for t in task_ids if t in self.task_sessions}

    def _in_background(self, work: Callable[[], None]) -> None:
        """Faults that take seconds (a worker starting, a soft shutdown) must not pause the
        others: run them beside the fault loop, as an orchestrator would."""
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _replace(self) -> None:
        self._in_background(
            lambda: self.workers.append(self.start_worker(concurrency=2, env=self.env))
        )

    def kill_a_child(self) -> None:
        children = [c for w in self.live() for c in w.children()]
        if not children:
            return
        child = self.rng.choice(children)
        in_flight = self.recovery.at_stake(self.held())
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.child_kills += 1
        if in_flight:  # else nothing was at stake: nothing to time
            self.recovery.fault("child", in_flight, time.monotonic())

    def kill_whole_worker(self, victim: WorkerProcess) -> None:
        # The host stalls, then vanishes: its children are frozen first, so the jobs the
        # worker takes meanwhile are still unstarted at the kill. A running finalize is one
        # statement that lands within milliseconds: a kill alone rarely catches one unlanded.
        for child in victim.children():
            with suppress(ProcessLookupError):
                os.kill(child, signal.SIGSTOP)
        time.sleep(FREEZE_S * (1 + self.whole_kills))  # longer on each try: jobs to take
        its_jobs = self._sessions(_unfinished(victim))
        victim.kill_hard()  # main process and children: nothing is handed back
        killed_at = time.monotonic()
        self.timeline.append((killed_at, f"whole kill -9 of {victim.log_path.name}"))
        if self.broker is None:
            # RabbitMQ returns them the moment the connection drops: its jobs not yet landed.
            held = its_jobs - landed(its_jobs)
            self._replace()
        else:
            self._replace()
            # What live workers hold is done within a moment; what stays is the dead worker's.
            first = self.held()
            time.sleep(1.0)
            held = (first & self.held()) - landed(first)
        self.whole_kills += 1
        self.whole_kill_held = len(held)
        if held:
            self.recovery.fault("whole kill", held, killed_at)

    def sigterm_worker(self, victim: WorkerProcess) -> None:
        held = self.recovery.at_stake(self.held())
        t0 = time.monotonic()
        self.timeline.append((t0, f"SIGTERM of {victim.log_path.name}"))
        self.sigterm_held = len(held)
        if held:
            self.recovery.fault("sigterm", held, t0)

        def stop() -> None:
            self.sigterm_code = victim.stop(60)  # soft shutdown, then it hands back
            self.sigterm_exit_s = time.monotonic() - t0
            self.timeline.append((time.monotonic(), "SIGTERM'd worker exited"))

        self._in_background(stop)
        self._replace()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(90)


def _unfinished(worker: WorkerProcess) -> set[str]:
    """Task ids of the finalize jobs the worker's log shows received and not finished."""
    received: set[str] = set()
    finished: set[str] = set()
    for task_id, what in TASK_LINE.findall(worker.log()):
        (received if what == "received" else finished).add(task_id)
    return received - finished
