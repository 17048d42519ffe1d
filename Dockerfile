# One image for every agent-memory process: `docker run IMAGE migrate|worker|flower|...`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /src/
COPY memory_core /src/memory_core
COPY workers /src/workers
COPY migrations /src/migrations

# With the langgraph extra, `agent-memory migrate` also creates the LangGraph checkpointer
# tables (schema langgraph); the inspector extra serves `agent-memory inspect serve`. The wheel's one top-level package holds workers/ and migrations/
# (`memory_core.workers.app` is the Celery app here). The source tree is removed afterwards:
# `celery -A` puts the working directory on sys.path, where a stray copy would shadow it.
RUN pip install "/src[langgraph,inspector]" \
    && rm -rf /src \
    && useradd --create-home --uid 10001 --user-group app

# Numeric uid so that Kubernetes' runAsNonRoot can verify it.
USER 10001
WORKDIR /home/app

ENTRYPOINT ["agent-memory"]
CMD ["--help"]
