"""A tiny MCP server over stdio for the tests: paged tools/list, and tools that echo, fail,
answer garbage, take too long, crash, hang the whole server, flood it with notifications,
send an over-long line, show its environment, start a grandchild that leaves its process
group, count (state kept between calls), and record a token in TINY_RECORD. TINY_LOG names a file where it notes every
notifications/cancelled it receives; TINY_TOOLS adds tools by name (comma-separated)."""
import json
import os
import subprocess
import sys
import time


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request_id, result):
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def text(request_id, value):
    answer(request_id, {"content": [{"type": "text", "text": value}]})


count = 0
extra = [name for name in os.environ.get("TINY_TOOLS", "").split(",") if name]
print("tiny MCP server starting (not JSON)", flush=True)
for line in sys.stdin:
    message = json.loads(line)
    request_id, method = message.get("id"), message.get("method")
    params = message.get("params") or {}
    if method == "initialize":
        answer(request_id, {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                            "serverInfo": {"name": "tiny", "version": "1"}})
    elif method == "ping":
        answer(request_id, {})
    elif method == "notifications/cancelled":
        if os.environ.get("TINY_LOG"):
            with open(os.environ["TINY_LOG"], "a") as log:
                log.write("cancelled %s\n" % params.get("requestId"))
    elif method == "tools/list" and "cursor" not in params:
        answer(request_id, {"tools": [{"name": "echo", "description": "Echoes its arguments",
                                       "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}],
                            "nextCursor": "page-2"})
    elif method == "tools/list":
        names = ["fails", "garbage", "slow", "crash", "hang", "flood", "long_line", "env", "spawn", "counter", "record"]
        answer(request_id, {"tools": [{"name": name} for name in names + extra]})
    elif method == "tools/call":
        name, arguments = params["name"], params.get("arguments", {})
        if name == "echo" or name in extra:
            text(request_id, json.dumps(arguments, sort_keys=True))
        elif name == "fails":
            answer(request_id, {"content": [{"type": "text", "text": "it did not work"}], "isError": True})
        elif name == "garbage":
            print("{this is not json", flush=True)
            answer(request_id + 1000, {"content": []})
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "bad arguments"}})
        elif name == "slow":
            time.sleep(1)  # the tool itself is slow on purpose: what is tested is a slow tool
            text(request_id, "late")
        elif name == "crash":
            os._exit(3)
        elif name == "hang":
            if os.environ.get("TINY_LOG"):
                with open(os.environ["TINY_LOG"], "a") as log:
                    log.write("hanging\n")
            time.sleep(3600)  # the whole server stops answering: what is tested is a hung server
        elif name == "flood":
            note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                               "params": {"level": "info", "data": "x" * 100}}) + "\n"
            for _ in range(int(arguments.get("count", 100000))):
                sys.stdout.write(note)
            text(request_id, "after the flood")
        elif name == "long_line":
            sys.stdout.write("x" * (20 * 1024 * 1024) + "\n")
            text(request_id, "after the line")
        elif name == "env":
            text(request_id, json.dumps(dict(os.environ), sort_keys=True))
        elif name == "spawn":
            child = subprocess.Popen(["sleep", "300"], start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            text(request_id, str(child.pid))
        elif name == "counter":
            count += 1
            text(request_id, str(count))
        elif name == "record":
            # A side effect to count: the token goes to TINY_RECORD before the tool's delay.
            with open(os.environ["TINY_RECORD"], "a") as log:
                log.write("%s\n" % arguments.get("token"))
            time.sleep(float(arguments.get("sleep", 0)))
            text(request_id, "recorded")
