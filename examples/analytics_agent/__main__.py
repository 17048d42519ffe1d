"""`python -m examples.analytics_agent [start|resume ...]`: the scripted run, or one step."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.analytics_agent",
        description="An analytics agent on LangGraph with conversation memory. "
        "Without a command: the scripted three-run conversation.",
    )
    parser.add_argument("--thread", help="conversation thread id (scripted run; default: new)")
    parser.add_argument("--owner", default="analyst-7", help="the thread's owner")
    sub = parser.add_subparsers(dest="command")
    st = sub.add_parser("start", help="start a run: one user query in a thread")
    st.add_argument("--session", required=True, help="this run's session (turn) id")
    st.add_argument("--query", required=True)
    rs = sub.add_parser("resume", help="resume a paused run from the checkpointer")
    rs.add_argument("--session", required=True)
    rs.add_argument("--reject", action="store_true", help="do not approve the SQL")
    rs.add_argument("--by", default="a human", help="who approved (for the transcript)")
    for p in (st, rs):
        p.add_argument("--label", default="run", help="transcript label")
    args = parser.parse_args(argv)

    if args.command is None:
        from examples.analytics_agent.script import play

        return play(args.thread, args.owner)
    from examples.analytics_agent import runner

    if args.command == "start":
        if not args.thread:
            parser.error("start needs --thread")
        return runner.start(args.thread, args.owner, args.session, args.query, args.label)
    return runner.resume(args.session, not args.reject, args.by, args.label)


if __name__ == "__main__":
    sys.exit(main())
