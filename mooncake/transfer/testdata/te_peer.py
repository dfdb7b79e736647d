"""A Mooncake Transfer Engine peer driven by JSON lines on stdin, for kvctl's interop tests.

It starts the real TransferEngine from the pinned wheel (TCP protocol, metadata on an HTTP
metadata server), registers one buffer of its own, and answers one JSON line on stdout per
command. Logs go to stderr.
"""

import base64
import ctypes
import json
import sys
import time

from mooncake.engine import TransferEngine


def main():
    name, metadata, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    engine = TransferEngine()
    rc = engine.initialize(name, metadata, "tcp", "")
    if rc != 0:
        print(json.dumps({"error": "initialize returned %d" % rc}), flush=True)
        return 1
    buf = ctypes.create_string_buffer(size)
    base = ctypes.addressof(buf)
    rc = engine.register_memory(base, size)
    if rc != 0:
        print(json.dumps({"error": "register_memory returned %d" % rc}), flush=True)
        return 1
    print(json.dumps({"name": name, "base": base, "size": size}), flush=True)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out = {}
        if op == "fill":
            data = base64.b64decode(cmd["data"])
            ctypes.memmove(base + cmd["off"], data, len(data))
        elif op == "dump":
            out["data"] = base64.b64encode(ctypes.string_at(base + cmd["off"], cmd["len"])).decode()
        elif op in ("read", "write"):
            fn = engine.transfer_sync_read if op == "read" else engine.transfer_sync_write
            out["rc"] = fn(cmd["target"], base + cmd["off"], cmd["addr"], cmd["len"])
        elif op == "bench":
            fn = engine.transfer_sync_read if cmd["kind"] == "read" else engine.transfer_sync_write
            t0 = time.perf_counter_ns()
            for _ in range(cmd["n"]):
                rc = fn(cmd["target"], base + cmd["off"], cmd["addr"], cmd["len"])
                if rc != 0:
                    out["rc"] = rc
                    break
            out["ns"] = time.perf_counter_ns() - t0
        elif op == "quit":
            break
        else:
            out["error"] = "unknown op %r" % op
        print(json.dumps(out), flush=True)
    engine.unregister_memory(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
