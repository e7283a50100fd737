"""Drives `glovebox mcp` with the official MCP Python SDK, as an MCP host would.

Usage: python3 mcp_client.py <glovebox binary>
(GLOVEBOX_URL / GLOVEBOX_API_KEY in the environment point it at a daemon.)

Prints one JSON object per step on stdout; crates/glovebox/tests/mcp.rs asserts on them.
Written against both the 1.x and the 2.x SDK (attribute names differ between them).
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def field(obj, *names):
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    raise AttributeError(f"{type(obj).__name__} has none of {names}")


def emit(step, **kw):
    print(json.dumps({"step": step, **kw}), flush=True)


async def call(session, step, name, args):
    r = await asyncio.wait_for(session.call_tool(name, args), 120)
    text = "\n".join(c.text for c in r.content if c.type == "text")
    emit(step, text=text, is_error=bool(field(r, "isError", "is_error")))


async def main(glovebox):
    params = StdioServerParameters(command=glovebox, args=["mcp", "--timeout", "10m"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await asyncio.wait_for(session.initialize(), 60)
            emit(
                "initialize",
                protocol=field(init, "protocolVersion", "protocol_version"),
                server=field(init, "serverInfo", "server_info").name,
            )
            tools = (await asyncio.wait_for(session.list_tools(), 30)).tools
            emit(
                "tools",
                names=[t.name for t in tools],
                schemas={t.name: field(t, "inputSchema", "input_schema") for t in tools},
            )
            await call(session, "echo", "run_command", {"command": "echo hi"})
            await call(session, "write_file", "write_file", {"path": "py.txt", "content": "written by python\n"})
            await call(session, "cat", "run_command", {"command": "cat /home/user/py.txt"})
            await call(session, "run_code", "run_code", {"code": "6*7"})
            await call(session, "read_file", "read_file", {"path": "/home/user/py.txt"})
            await call(session, "list_files", "list_files", {})
            await call(session, "bad_arguments", "run_code", {"source": "1"})
            try:
                await asyncio.wait_for(session.call_tool("no_such_tool", {}), 30)
                emit("unknown_tool", error="")
            except asyncio.TimeoutError:
                raise
            except Exception as e:  # the SDK's error type differs between versions
                err = getattr(e, "error", None)
                emit("unknown_tool", error=str(e) or repr(e), code=getattr(err, "code", getattr(e, "code", None)))
    emit("closed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: mcp_client.py <glovebox binary>")
    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 200))
