"""Small local HTTP servers speaking the real protocols of third-party services (LLM, Langfuse).

They let tests drive the real `openai` and `langfuse` clients; nothing is mocked.
"""

from tests.fakes.langfuse_server import FakeLangfuseServer, HangingServer, closed_port
from tests.fakes.llm_server import FakeLLMServer

__all__ = ["FakeLLMServer", "FakeLangfuseServer", "HangingServer", "closed_port"]
