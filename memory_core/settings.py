"""One settings object for the whole system, read from the environment (and `.env`).

Settings that cannot work are refused up front, with one line naming the variable
(`SettingsError`): an infinite TTL, recent turns not below the threshold, a URL of the wrong
kind. The CLI and the workers check them before doing anything else (a worker with
impossible settings never takes a job); a host embedding the library should call
`get_settings()` at startup for the same effect (a save with bad settings answers `failed`).
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memory_core.io.redis_kinds import CLUSTER_SCHEMES, cluster_seeds, is_cluster_url

REDIS_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
BROKER_SCHEMES = ("redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp", "memory")
_HUNDRED_YEARS_H = 24 * 365 * 100


class SettingsError(ValueError):
    """Settings that cannot work; the message names the environment variable."""


class Settings(BaseSettings):
    """Environment-driven configuration; docs/ARCHITECTURE.md, "Names", lists the variables."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", case_sensitive=False, allow_inf_nan=False
    )

    database_url: str = "postgresql://postgres@127.0.0.1:5432/agent_memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Empty means "same as REDIS_URL" (filled in by the validator below).
    celery_broker_url: str = ""

    openai_base_url: str | None = None
    openai_api_key: str | None = None
    memory_summarizer_model: str = "gpt-4o-mini"
    memory_llm_timeout_s: float = Field(default=60.0, gt=0)

    langfuse_public_key: str | None = None
    langfuse_secret_key: str | None = None
    langfuse_base_url: str | None = None
    langfuse_prompt_timeout_s: float = Field(default=3.0, gt=0)
    langfuse_prompt_cache_ttl_s: int = Field(default=300, ge=0)
    # Each request of a trace purge (listing a session's observations can take Langfuse tens
    # of seconds); off the request path except for `delete_thread`'s first attempt.
    langfuse_api_timeout_s: float = Field(default=30.0, gt=0)

    # Tuning of RedisConversationMemory; its constructor arguments override these.
    memory_ttl_hours: float = Field(default=24, gt=0, le=_HUNDRED_YEARS_H)
    memory_max_recent_messages: int = Field(default=10, ge=1)
    memory_compression_threshold: int = Field(default=20, ge=2)
    # Fold also when the unfolded turns' estimated tokens (tokens.turn_size) exceed this and
    # at least 2 turns are unfolded; 0 turns the token trigger off (turn count only).
    memory_fold_token_trigger: int = Field(default=6000, ge=0)
    memory_key_prefix: str = Field(default="chat_conversation", min_length=1)
    # Cap on unfolded turns kept in the working copy while folding keeps failing.
    # None means 2 x compression_threshold (the documented minimum).
    memory_max_unfolded_messages: int | None = None

    # Parsed contexts kept per process, keyed by the working copy's version (0 disables),
    # and the bytes (of the copies' stored JSON) they may hold.
    memory_local_cache_size: int = Field(default=1024, ge=0)
    memory_local_cache_max_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    # How long `get_context(wait_for=...)` waits for an enqueued turn by default (seconds).
    memory_read_wait_s: float = Field(default=5.0, gt=0, le=300)

    # Folding: a fold queued this long ago and not yet run is considered lost and
    # may be re-published by the next finalize on the thread.
    memory_fold_republish_grace_s: int = Field(default=300, ge=1)
    memory_fold_lease_s: int = Field(default=360, ge=1)
    memory_summary_max_tokens: int = Field(default=1500, ge=50)
    # Failed LLM attempts of one fold before it uses the LLM-free summary instead (an error
    # no retry can fix, such as a context-length or content-filter refusal, falls back at once).
    memory_fold_max_llm_attempts: int = Field(default=8, ge=1)
    # A failed fold is retried after base * 2^(attempt - 1) seconds, at most cap (60, 120, 240,
    # ..., 3600). The cap bounds the visibility timeout on Redis (workers/app.py).
    memory_fold_backoff_base_s: int = Field(default=60, ge=1, le=86_400)
    memory_fold_backoff_cap_s: int = Field(default=3600, ge=1, le=86_400)

    # Broker redelivery delay for unacked jobs; None = longest retry countdown + time limit.
    memory_visibility_timeout_s: int | None = Field(default=None, ge=1)
    memory_unacked_restore_interval_s: int = Field(default=10, ge=1)
    memory_worker_soft_shutdown_s: float = Field(default=30.0, ge=0)
    memory_finalize_retry_cap_s: int = Field(default=60, ge=1)
    # A finalize running longer than this gets SoftTimeLimitExceeded (retried); at twice this
    # its pool process is killed and the job redelivered. Read when the worker starts.
    memory_finalize_soft_limit_s: int = Field(default=30, ge=1, le=3600)
    # RabbitMQ: deliveries of one job (each worker that died holding it counts) before the task
    # dead-letters it to `memory.dead` with a `memory_job_dead_lettered` event. Below the
    # broker's own limit (queues.BROKER_DELIVERY_LIMIT = 20), so the event always comes first.
    # Redis counts no deliveries: there it does not apply.
    memory_max_deliveries: int = Field(default=8, ge=2, le=19)

    # Thread lifecycle (memory_core/lifecycle/threads.py). Threads with no new turn for longer than
    # this many days are deleted by `memory.apply_retention`; None keeps them forever.
    memory_retention_days: float | None = Field(default=None, gt=0, le=36_500)
    # The minute of each hour at which beat sends `memory.apply_retention`.
    memory_retention_minute: int = Field(default=17, ge=0, le=59)
    # Threads deleted per transaction by forget-owner and retention (a crash loses at most one).
    memory_purge_batch_size: int = Field(default=100, ge=1, le=1000)
    # Langfuse traces of a deleted thread are purged again until this long after the delete
    # (a fold that was mid-call may still be sending its trace); then its request is done.
    memory_trace_purge_settle_s: int = Field(default=1800, ge=0)

    memory_events_stream: str = "memory:events"
    memory_events_maxlen: int = Field(default=100_000, ge=100)

    # user:password for Flower; no default, so `agent-memory flower` refuses to run without one.
    flower_basic_auth: str = ""
    # user:password for `agent-memory inspect serve`; no default: it refuses to run without one.
    memory_inspector_auth: str = ""

    @field_validator("database_url")
    @classmethod
    def _psycopg2_driver(cls, v: str) -> str:
        # Accept the libpq-style URL operators usually have and pin the installed driver.
        for prefix in ("postgres://", "postgresql://"):
            if v.startswith(prefix):
                return "postgresql+psycopg2://" + v[len(prefix) :]
        return v

    @field_validator("memory_key_prefix")
    @classmethod
    def _no_hash_tag(cls, v: str) -> str:
        # The thread id is the hash tag ({...}) that keeps a thread's keys in one slot.
        if "{" in v or "}" in v or any(c.isspace() for c in v):
            raise ValueError("must not contain braces or whitespace")
        return v

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        if is_cluster_url(self.redis_url):
            try:
                cluster_seeds(self.redis_url)
            except ValueError as exc:
                raise ValueError(f"REDIS_URL: {exc}") from None
            if not self.celery_broker_url:
                raise ValueError(
                    "CELERY_BROKER_URL must be set when REDIS_URL is a Redis Cluster: Celery's "
                    "Redis transport needs one server (or use RabbitMQ)"
                )
        if not self.celery_broker_url:
            self.celery_broker_url = self.redis_url
        threshold = self.memory_compression_threshold
        cap = self.memory_max_unfolded_messages
        if cap is not None and cap < 2 * threshold:
            raise ValueError(
                "MEMORY_MAX_UNFOLDED_MESSAGES must be at least 2 x MEMORY_COMPRESSION_THRESHOLD"
            )
        if self.memory_max_recent_messages >= threshold:
            raise ValueError(
                f"MEMORY_MAX_RECENT_MESSAGES ({self.memory_max_recent_messages}) must be below "
                f"MEMORY_COMPRESSION_THRESHOLD ({threshold})"
            )
        if self.memory_fold_backoff_cap_s < self.memory_fold_backoff_base_s:
            raise ValueError(
                f"MEMORY_FOLD_BACKOFF_CAP_S ({self.memory_fold_backoff_cap_s}) must be at least "
                f"MEMORY_FOLD_BACKOFF_BASE_S ({self.memory_fold_backoff_base_s})"
            )
        _check_scheme("REDIS_URL", self.redis_url, REDIS_SCHEMES)
        _check_scheme("CELERY_BROKER_URL", self.celery_broker_url, BROKER_SCHEMES)
        if not self.database_url.startswith("postgresql"):
            raise ValueError("DATABASE_URL must be a postgresql:// URL")
        return self

    @property
    def llm_configured(self) -> bool:
        return bool(self.openai_base_url or self.openai_api_key)

    @property
    def langfuse_configured(self) -> bool:
        return bool(self.langfuse_public_key and self.langfuse_secret_key)


def _check_scheme(name: str, url: str, schemes: tuple[str, ...]) -> None:
    scheme = urlsplit(url).scheme
    if scheme not in schemes:
        raise ValueError(f"{name} must be a {'/'.join(schemes)} URL, not {scheme or 'empty'}://")


def load_settings() -> Settings:
    """`Settings()`, or `SettingsError` in one line naming the variable and the problem."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(describe_settings_error(exc)) from None


def describe_settings_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        msg = str(err["msg"]).removeprefix("Value error, ")
        name = str(err["loc"][0]).upper() if err["loc"] else ""
        parts.append(f"{name} {msg[:1].lower()}{msg[1:]}" if name else msg)
    return "invalid settings: " + "; ".join(parts)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()


def reset_settings_cache() -> None:
    """Forget the cached settings (tests and the CLI change the environment)."""
    get_settings.cache_clear()
