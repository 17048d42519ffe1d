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
# tables (schema langgraph). The wheel ships migrations/ beside memory_core. The
# source tree is removed afterwards: `celery -A workers.app` puts the working directory on
# sys.path, and a stray source copy there would shadow the installed package.
RUN pip install "/src[langgraph]" \
    && rm -rf /src \
    && useradd --create-home --uid 10001 --user-group app

# Numeric uid so that Kubernetes' runAsNonRoot can verify it.
USER 10001
WORKDIR /home/app

ENTRYPOINT ["agent-memory"]
CMD ["--help"]
