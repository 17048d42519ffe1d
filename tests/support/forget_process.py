"""`forget_owner` in a process of its own, for a test to kill
(tests/reliability/test_forget_crash.py).

    python -m tests.support.forget_process OWNER BATCH_SIZE PROGRESS_FILE APPLICATION_NAME

Settings come from the environment (DATABASE_URL, REDIS_URL: the test's stack). Its Postgres
sessions carry APPLICATION_NAME, so the test can find them in `pg_stat_activity`; after each
committed batch it appends the running report to PROGRESS_FILE as one JSON line (flushed), so
the test knows how far it got. The final report is printed as JSON on stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlalchemy import create_engine

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.lifecycle.threads import PurgeReport, forget_owner
from memory_core.settings import get_settings


def main(argv: list[str]) -> int:
    owner, batch_size, progress_file, app = argv
    engine = create_engine(
        get_settings().database_url,
        connect_args={"connect_timeout": 5, "application_name": app},
        hide_parameters=True,
    )
    memory = RedisConversationMemory(engine=engine)
    path = Path(progress_file)

    def progress(report: PurgeReport, total: int) -> None:
        with path.open("a") as out:
            out.write(json.dumps({**report.as_dict(), "total": total}) + "\n")
            out.flush()

    report = forget_owner(owner, memory=memory, batch_size=int(batch_size), progress=progress)
    print(json.dumps(report.as_dict()))
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
