"""The memory inspector: `agent-memory inspect serve`, a read-only web page per thread.

What an operator opens on a "the agent forgot" report: a thread's summary (standing
instructions set apart), its turns, each node view under a chosen budget, the fold state and
the thread's recent events. Behind basic auth (MEMORY_INSPECTOR_AUTH); the `inspector` extra
brings Starlette, Jinja2 and uvicorn.

- `reads.py`: what a page shows, read from Postgres and Redis without writing either.
- `app.py`: `create_app`, the Starlette application: routes, basic auth, security headers,
  the access log.
- `templates/`, `static/`: the pages (Jinja2, autoescaped) and their one stylesheet; no
  script, nothing from a CDN.
"""
