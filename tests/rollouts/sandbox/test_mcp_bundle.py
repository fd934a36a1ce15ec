"""An MCP server shipped in a bundle serves the agent's tools inside the real jail: rollout.py starts it as a
subprocess over stdio with the `mcp` library, lists its tools, turns them into OpenAI tools with
`art.mcp.MCPTool`, calls one and keeps the result in the trajectory (the example in
docs/concepts/tasks.md#an-mcp-server-in-the-bundle)."""

from __future__ import annotations

import pytest

from rollouts.sandbox.bundles import bundle_read, bundle_store
from rollouts.sandbox.rollouts import dry_run
from tests.rollouts.bundle_zips import make_zip

from .conftest import NO_SERVER

SERVER = '''
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("board-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def whoami() -> list[int]:
    """This process's id and its parent's."""
    return [os.getpid(), os.getppid()]


if __name__ == "__main__":
    server.run()  # stdio: JSON-RPC on stdin and stdout
'''

ROLLOUT = """
import json
import os
import sys
from pathlib import Path

import art
from art.mcp import MCPTool
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SERVER = StdioServerParameters(command=sys.executable, args=[str(Path(__file__).parent / "tools_server.py")])


async def rollout(model, scenario):
    async with stdio_client(SERVER) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        tools = [MCPTool(t.name, t.description or "", t.input_schema).to_tool_schema() for t in listed.tools]
        arguments = {"a": scenario.a, "b": scenario.b}
        added = await session.call_tool("add", arguments)
        ids = await session.call_tool("whoami", {})
    answer = added.content[0].text
    call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": json.dumps(arguments)}}
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": f"What is {scenario.a} + {scenario.b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": answer},
        ],
        tools=tools,
        reward=1.0 if int(answer) == scenario.a + scenario.b else 0.0,
        metadata={"answer": answer, "server": ids.structured_content["result"], "rollout_pid": os.getpid()},
    )
    return trajectory
"""


@pytest.mark.slow
def test_it_serves_a_bundled_mcp_servers_tools_to_the_rollout_inside_the_jail(tmp_path):
    files = [("rollout.py", ROLLOUT.encode()), ("tools_server.py", SERVER.encode())]
    path = bundle_store(bundle_read(make_zip(files)), tmp_path / "bundles")
    result = dry_run(
        script=ROLLOUT,
        reward=None,
        scenarios=[{"a": 2, "b": 3}, {"a": 40, "b": 2}],
        base_url=NO_SERVER,
        model_name="none",
        timeout_s=120,
        bundle=path,
    )
    assert result["errors"] == [], result["errors"]
    by_scenario = sorted(result["trajectories"], key=lambda t: t["scenario_index"])
    assert [t["metadata"]["answer"] for t in by_scenario] == ["5", "42"]
    assert [t["reward"] for t in by_scenario] == [1.0, 1.0]
    for trajectory in by_scenario:
        server_pid, server_parent = trajectory["metadata"]["server"]
        # The server is the rollout's own child, in the jail's pid namespace (small pids, not the host's).
        assert server_parent == trajectory["metadata"]["rollout_pid"] != server_pid
        names = [tool["function"]["name"] for tool in trajectory["tools"]]
        assert names == ["add", "whoami"]
        add = trajectory["tools"][0]["function"]
        assert add["description"] == "Add two integers."
        assert add["parameters"]["required"] == ["a", "b"]
        assert trajectory["messages"][-1]["content"] == trajectory["metadata"]["answer"]
