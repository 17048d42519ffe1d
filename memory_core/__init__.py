"""Agent conversation memory: the core, sync and asyncio (importable without Celery running)."""

from memory_core.conversation_memory import RedisConversationMemory, ThreadNotFound
from memory_core.copy.context import ConversationContext, Exchange
from memory_core.copy.read_wait import TurnNotReady
from memory_core.copy.views import render_conversation_context
from memory_core.io.aio import aclose_connections
from memory_core.lifecycle.threads import (
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
from memory_core.settings import Settings, get_settings
from memory_core.write.artifacts import (
    Artifact,
    DashboardArtifact,
    SqlArtifact,
    StandingArtifact,
    VisualizationArtifact,
    derive_artifacts,
)
from memory_core.write.enqueue import aenqueue_turn, enqueue_turn
from memory_core.write.session_handler import (
    SaveOutcome,
    asave_session_to_thread_safe,
    save_session_to_thread_safe,
)
from memory_core.write.snapshot import TurnSnapshot

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
    "StandingArtifact",
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
