"""`python -m examples.analytics_agent [start|resume ...]`: the scripted run, or one step."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.analytics_agent",
        description="An analytics agent on LangGraph with conversation memory. "
        "Without a command: the scripted three-run conversation.",
    )
    parser.add_argument("--thread", help="conversation thread id (scripted run; default: new)")
    parser.add_argument("--owner", default="analyst-7", help="the thread's owner")
    parser.add_argument(
        "--async",
        dest="use_async",
        action="store_true",
        help="async graph: memory nodes as coroutines, astream, AsyncPostgresSaver",
    )
    parser.add_argument(
        "--finalize",
        choices=["inprocess", "enqueue"],
        default="inprocess",
        help="save each turn in-process, or enqueue it for a worker (agent-memory worker)",
    )
    sub = parser.add_subparsers(dest="command")
    st = sub.add_parser("start", help="start a run: one user query in a thread")
    st.add_argument("--session", required=True, help="this run's session (turn) id")
    st.add_argument("--query", required=True)
    st.add_argument("--await-session", help="the previous run's enqueued turn: wait for it")
    rs = sub.add_parser("resume", help="resume a paused run from the checkpointer")
    rs.add_argument("--session", required=True)
    rs.add_argument("--reject", action="store_true", help="do not approve the SQL")
    rs.add_argument("--by", default="a human", help="who approved (for the transcript)")
    for p in (st, rs):
        p.add_argument("--label", default="run", help="transcript label")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        from examples.analytics_agent.script import play

        return play(args.thread, args.owner, use_async=args.use_async, finalize=args.finalize)
    from examples.analytics_agent import runner

    mode = runner.Mode(use_async=args.use_async, finalize=args.finalize)
    if args.command == "start":
        if not args.thread:
            parser.error("start needs --thread")
        return runner.start(
            args.thread,
            args.owner,
            args.session,
            args.query,
            args.label,
            mode=mode,
            await_session=args.await_session,
        )
    return runner.resume(args.session, not args.reject, args.by, args.label, mode=mode)


if __name__ == "__main__":
    sys.exit(main())
