"""One settings object for the whole system, read from the environment (and `.env`)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Environment-driven configuration; names are fixed by ARCHITECTURE.md."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    database_url: str = "postgresql://postgres@127.0.0.1:5432/agent_memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Empty means "same as REDIS_URL" (filled in by the validator below).
    celery_broker_url: str = ""

    openai_base_url: str | None = None
    openai_api_key: str | None = None
    memory_summarizer_model: str = "gpt-4o-mini"
    memory_llm_timeout_s: float = 60.0

    langfuse_public_key: str | None = None
    langfuse_secret_key: str | None = None
    langfuse_base_url: str | None = None
    langfuse_prompt_timeout_s: float = 3.0
    langfuse_prompt_cache_ttl_s: int = 300

    # The seed's constructor defaults of RedisConversationMemory, promoted to settings.
    memory_ttl_hours: float = Field(default=24, gt=0)
    memory_max_recent_messages: int = Field(default=10, ge=1)
    memory_compression_threshold: int = Field(default=20, ge=2)
    memory_key_prefix: str = Field(default="chat_conversation", min_length=1)
    # Cap on unfolded turns kept in the working copy while folding keeps failing.
    # None means 2 x compression_threshold (the documented minimum).
    memory_max_unfolded_messages: int | None = None

    # Parsed contexts kept per process, keyed by the working copy's version (0 disables),
    # and the bytes (of the copies' stored JSON) they may hold.
    memory_local_cache_size: int = Field(default=1024, ge=0)
    memory_local_cache_max_bytes: int = Field(default=32 * 1024 * 1024, ge=0)

    # Folding: a fold queued this long ago and not yet run is considered lost and
    # may be re-published by the next finalize on the thread.
    memory_fold_republish_grace_s: int = Field(default=300, ge=1)
    memory_fold_lease_s: int = Field(default=360, ge=1)
    memory_summary_max_tokens: int = Field(default=1500, ge=50)
    # Failed LLM attempts of one fold before it uses the LLM-free summary instead (an error
    # no retry can fix, such as a context-length or content-filter refusal, falls back at once).
    memory_fold_max_llm_attempts: int = Field(default=8, ge=1)

    # Broker redelivery delay for unacked jobs; None = longest retry countdown + time limit.
    memory_visibility_timeout_s: int | None = Field(default=None, ge=1)
    memory_unacked_restore_interval_s: int = Field(default=10, ge=1)
    memory_worker_soft_shutdown_s: float = Field(default=30.0, ge=0)
    memory_finalize_retry_cap_s: int = Field(default=60, ge=1)

    memory_events_stream: str = "memory:events"
    memory_events_maxlen: int = Field(default=100_000, ge=100)

    # user:password for Flower; no default, so `agent-memory flower` refuses to run without one.
    flower_basic_auth: str = ""

    @field_validator("database_url")
    @classmethod
    def _psycopg2_driver(cls, v: str) -> str:
        # Accept the libpq-style URL operators usually have and pin the installed driver.
        for prefix in ("postgres://", "postgresql://"):
            if v.startswith(prefix):
                return "postgresql+psycopg2://" + v[len(prefix) :]
        return v

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        if not self.celery_broker_url:
            self.celery_broker_url = self.redis_url
        cap = self.memory_max_unfolded_messages
        if cap is not None and cap < 2 * self.memory_compression_threshold:
            raise ValueError(
                "MEMORY_MAX_UNFOLDED_MESSAGES must be at least 2 x MEMORY_COMPRESSION_THRESHOLD"
            )
        return self

    @property
    def llm_configured(self) -> bool:
        return bool(self.openai_base_url or self.openai_api_key)

    @property
    def langfuse_configured(self) -> bool:
        return bool(self.langfuse_public_key and self.langfuse_secret_key)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings_cache() -> None:
    """Forget the cached settings (tests and the CLI change the environment)."""
    get_settings.cache_clear()
