"""The agent process: ``Agent`` runs the model loop, its tool calls go through a ``Dispatcher``."""

from ._agent import Agent, RunResult, resolve_model
from ._anthropic import AnthropicModel
from ._model import (
    AssistantMessage,
    FakeModel,
    Message,
    Model,
    ModelError,
    ModelRequest,
    SystemMessage,
    ToolMessage,
    ToolSpec,
    UserMessage,
)
from ._openai import OpenAIModel
from ._runs import RunConflict, RunEntry, RunError, RunNotFound, RunState, RunStatus

__all__ = [
    "Agent",
    "AnthropicModel",
    "AssistantMessage",
    "FakeModel",
    "Message",
    "Model",
    "ModelError",
    "ModelRequest",
    "OpenAIModel",
    "RunConflict",
    "RunEntry",
    "RunError",
    "RunNotFound",
    "RunResult",
    "RunState",
    "RunStatus",
    "SystemMessage",
    "ToolMessage",
    "ToolSpec",
    "UserMessage",
    "resolve_model",
]
