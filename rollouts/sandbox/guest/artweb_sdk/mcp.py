"""`art.mcp`: ART's descriptions of MCP tools and resources, and of generated scenarios.

The types work as in ART. generate_scenarios asks an external model (OpenRouter by default) to write
scenarios, which the sandbox cannot reach: it raises, and the scenarios belong in the run's scenario set.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .errors import NotSupportedInSandbox


@dataclass
class MCPTool:
    """An MCP server's tool: its name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MCPTool:
        return cls(data.get("name", ""), data.get("description", ""), data.get("parameters", {}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_tool_schema(self) -> dict[str, Any]:
        """The tool in OpenAI's `tools=` format."""
        return {"type": "function", "function": self.to_dict()}


@dataclass
class MCPResource:
    """An MCP server's resource."""

    uri: str
    name: str
    description: str
    mime_type: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MCPResource:
        mime = data.get("mimeType") or data.get("mime_type")
        return cls(data.get("uri", ""), data.get("name", ""), data.get("description", ""), mime)

    def to_dict(self) -> dict[str, Any]:
        found = {"uri": self.uri, "name": self.name, "description": self.description}
        if self.mime_type:
            found["mimeType"] = self.mime_type
        return found


@dataclass
class GeneratedScenario:
    """A task for an agent, with its difficulty from 1 to 5."""

    task: str
    difficulty: int

    def __post_init__(self) -> None:
        if not isinstance(self.difficulty, int) or not 1 <= self.difficulty <= 5:
            raise ValueError("Difficulty must be an integer between 1 and 5")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GeneratedScenario:
        return cls(task=data["task"], difficulty=data["difficulty"])

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "difficulty": self.difficulty}

    def preview(self, max_length: int = 120) -> str:
        return self.task if len(self.task) <= max_length else self.task[:max_length].strip() + "…"


class GeneratedScenarioCollection:
    """A list of GeneratedScenario with ART's helpers: JSON in and out, shuffle, split, filter, summary."""

    def __init__(self, scenarios: list[GeneratedScenario]) -> None:
        self.scenarios = scenarios

    @classmethod
    def from_dicts(cls, data: list[dict[str, Any]]) -> GeneratedScenarioCollection:
        return cls([GeneratedScenario.from_dict(item) for item in data])

    @classmethod
    def from_json(cls, text: str) -> GeneratedScenarioCollection:
        """From `{"scenarios": [...]}`, a bare list, or an object whose first value is the list."""
        data = json.loads(text)
        if isinstance(data, dict):
            data = data["scenarios"] if "scenarios" in data else next(iter(data.values()))
        return cls.from_dicts(data)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.scenarios]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({"scenarios": self.to_dicts()}, indent=indent)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __iter__(self):
        return iter(self.scenarios)

    def __getitem__(self, index):
        return self.scenarios[index]

    def shuffle(self) -> GeneratedScenarioCollection:
        shuffled = list(self.scenarios)
        random.shuffle(shuffled)
        return GeneratedScenarioCollection(shuffled)

    def split(self, train_size: int) -> tuple[GeneratedScenarioCollection, GeneratedScenarioCollection]:
        if train_size > len(self.scenarios):
            raise ValueError(f"train_size ({train_size}) is larger than the {len(self.scenarios)} scenarios")
        return (
            GeneratedScenarioCollection(self.scenarios[:train_size]),
            GeneratedScenarioCollection(self.scenarios[train_size:]),
        )

    def filter_by_difficulty(self, min_difficulty: int = 1, max_difficulty: int = 5) -> GeneratedScenarioCollection:
        return GeneratedScenarioCollection(
            [s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty]
        )

    def get_difficulty_distribution(self) -> Counter:
        return Counter(s.difficulty for s in self.scenarios)

    def preview(self, n: int = 5, max_task_length: int = 120) -> None:
        for i, scenario in enumerate(self.scenarios[:n], start=1):
            print(f"   {i}. {scenario.preview(max_task_length)}  (difficulty {scenario.difficulty}/5)")

    def print_difficulty_distribution(self) -> None:
        counts = self.get_difficulty_distribution()
        print("Difficulty distribution:")
        for difficulty in range(1, 6):
            count = counts.get(difficulty, 0)
            print(f"   {difficulty}/5: {count:3d}  {'█' * min(count, 30)}")

    def get_summary(self) -> dict[str, Any]:
        count = len(self.scenarios)
        return {
            "total_scenarios": count,
            "difficulty_distribution": dict(self.get_difficulty_distribution()),
            "avg_difficulty": sum(s.difficulty for s in self.scenarios) / count if count else 0,
            "avg_task_length": sum(len(s.task) for s in self.scenarios) / count if count else 0,
        }


complete_task_tool = MCPTool(
    name="complete_task",
    description="Complete a task",
    parameters={
        "type": "object",
        "properties": {"summary": {"type": "string", "description": "Summary of accomplishments"}},
        "required": ["summary"],
    },
)


async def generate_scenarios(*args: Any, **kwargs: Any) -> GeneratedScenarioCollection:
    raise NotSupportedInSandbox(
        "art.mcp.generate_scenarios",
        "it asks an external model (OpenRouter by default) to write scenarios, and the sandbox reaches only "
        "its run's model.",
        "Generate the scenarios beforehand and upload them as the run's scenario set.",
    )
