"""A tiny MCP server over stdio for the tests: paged tools/list, and tools that echo, fail,
answer garbage, take too long or crash."""
import json
import os
import sys
import time


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request_id, result):
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


print("tiny MCP server starting (not JSON)", flush=True)
for line in sys.stdin:
    message = json.loads(line)
    request_id, method = message.get("id"), message.get("method")
    params = message.get("params") or {}
    if method == "initialize":
        answer(request_id, {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                            "serverInfo": {"name": "tiny", "version": "1"}})
    elif method == "tools/list" and "cursor" not in params:
        answer(request_id, {"tools": [{"name": "echo", "description": "Echoes its arguments",
                                       "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}],
                            "nextCursor": "page-2"})
    elif method == "tools/list":
        answer(request_id, {"tools": [{"name": name} for name in ["fails", "garbage", "slow", "crash"]]})
    elif method == "tools/call":
        name, arguments = params["name"], params.get("arguments", {})
        if name == "echo":
            answer(request_id, {"content": [{"type": "text", "text": json.dumps(arguments, sort_keys=True)}]})
        elif name == "fails":
            answer(request_id, {"content": [{"type": "text", "text": "it did not work"}], "isError": True})
        elif name == "garbage":
            print("{this is not json", flush=True)
            answer(request_id + 1000, {"content": []})
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "bad arguments"}})
        elif name == "slow":
            time.sleep(1)  # the tool itself is slow on purpose: what is tested is a slow tool
            answer(request_id, {"content": [{"type": "text", "text": "late"}]})
        elif name == "crash":
            os._exit(3)
