"""`art.mcp`: ART's MCP helpers (artweb_sdk.mcp)."""

from artweb_sdk.mcp import (
    GeneratedScenario,
    GeneratedScenarioCollection,
    MCPResource,
    MCPTool,
    complete_task_tool,
    generate_scenarios,
)

__all__ = [
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPResource",
    "MCPTool",
    "complete_task_tool",
    "generate_scenarios",
]
