"""A scripted model for the memory tests: each round's calls are a function of what the model saw.

The prompt is a JSON list of rounds; each round is a list of ``[tool, arguments]``. The final
answer is every tool message the model read, as JSON, so a test sees exactly what the model saw.
"""

from __future__ import annotations

import json
from typing import Any

from criogenai import FakeModel, ModelRequest, ToolMessage, UserMessage


def _round(i: int) -> Any:
    def play(request: ModelRequest) -> Any:
        prompt = next(m.content for m in request.messages if isinstance(m, UserMessage))
        rounds = json.loads(prompt)
        if i < len(rounds):
            return [{"id": f"r{i}c{j}", "name": n, "arguments": a} for j, (n, a) in enumerate(rounds[i])]
        seen = [
            {"name": m.name, "status": m.status, "content": m.content}
            for m in request.messages
            if isinstance(m, ToolMessage)
        ]
        return json.dumps(seen)

    return play


def scripted_model(rounds: int = 8) -> FakeModel:
    return FakeModel([_round(i) for i in range(rounds + 1)])


def prompt(*rounds: list[tuple[str, dict[str, Any]]]) -> str:
    return json.dumps([[list(c) for c in r] for r in rounds])


def seen(output: str) -> list[dict[str, str]]:
    result: list[dict[str, str]] = json.loads(output)
    return result
