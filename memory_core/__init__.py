"""Agent conversation memory: the synchronous core (importable without Celery running)."""

from memory_core.artifacts import (
    Artifact,
    DashboardArtifact,
    SqlArtifact,
    VisualizationArtifact,
    derive_artifacts,
)
from memory_core.context import ConversationContext, Exchange
from memory_core.conversation_memory import RedisConversationMemory, ThreadNotFound
from memory_core.session_handler import SaveOutcome, save_session_to_thread_safe
from memory_core.settings import Settings, get_settings
from memory_core.snapshot import TurnSnapshot
from memory_core.views import render_conversation_context

__all__ = [
    "Artifact",
    "ConversationContext",
    "DashboardArtifact",
    "Exchange",
    "RedisConversationMemory",
    "SaveOutcome",
    "Settings",
    "SqlArtifact",
    "ThreadNotFound",
    "TurnSnapshot",
    "VisualizationArtifact",
    "derive_artifacts",
    "get_settings",
    "render_conversation_context",
    "save_session_to_thread_safe",
]
