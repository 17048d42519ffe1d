"""Agent conversation memory: the core, sync and asyncio (importable without Celery running)."""

from memory_core.aio import aclose_connections
from memory_core.artifacts import (
    Artifact,
    DashboardArtifact,
    SqlArtifact,
    VisualizationArtifact,
    derive_artifacts,
)
from memory_core.context import ConversationContext, Exchange
from memory_core.conversation_memory import RedisConversationMemory, ThreadNotFound
from memory_core.enqueue import aenqueue_turn, enqueue_turn
from memory_core.lifecycle import (
    DeleteFailed,
    ForgetReport,
    PurgeReport,
    RetentionReport,
    ThreadInfo,
    apply_retention,
    archive_thread,
    delete_thread,
    forget_owner,
    list_threads,
    unarchive_thread,
)
from memory_core.read_wait import TurnNotReady
from memory_core.session_handler import (
    SaveOutcome,
    asave_session_to_thread_safe,
    save_session_to_thread_safe,
)
from memory_core.settings import Settings, get_settings
from memory_core.snapshot import TurnSnapshot
from memory_core.views import render_conversation_context

__all__ = [
    "Artifact",
    "ConversationContext",
    "DashboardArtifact",
    "DeleteFailed",
    "Exchange",
    "ForgetReport",
    "PurgeReport",
    "RedisConversationMemory",
    "RetentionReport",
    "SaveOutcome",
    "Settings",
    "SqlArtifact",
    "ThreadInfo",
    "ThreadNotFound",
    "TurnNotReady",
    "TurnSnapshot",
    "VisualizationArtifact",
    "aclose_connections",
    "aenqueue_turn",
    "apply_retention",
    "archive_thread",
    "asave_session_to_thread_safe",
    "delete_thread",
    "derive_artifacts",
    "enqueue_turn",
    "forget_owner",
    "get_settings",
    "list_threads",
    "render_conversation_context",
    "save_session_to_thread_safe",
    "unarchive_thread",
]
