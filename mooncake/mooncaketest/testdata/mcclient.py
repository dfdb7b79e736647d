"""Drives Mooncake's own Python store client for kvctl's interop tests.

Started by mooncake/mooncaketest with the pinned environment's python. It sets up one
MooncakeDistributedStore (TCP protocol) against the master named on the command line, then
answers one JSON request per line on stdin with one JSON reply per line on file descriptor 3
(the store's own logging owns stdout and stderr). Values travel through files, never through
printed representations: "put" reads the value from "file", "get" writes it to "file".

Requests: {"op": "put", "key", "file", "soft_pin", "ttl_ms", "hard_pin", "group"},
{"op": "get", "key", "file"}, {"op": "is_exist", "key"}, {"op": "batch_is_exist", "keys"},
{"op": "remove", "key", "force"}, {"op": "bench_put"|"bench_get", "prefix", "size", "n"},
{"op": "bench_put_batch"|"bench_get_batch", "prefix", "size", "n", "batch"},
{"op": "bench_exist", "keys", "present", "n"}, {"op": "quit"}. Replies carry "rc" and op-specific fields;
a request that raised carries "error".
"""

import json
import os
import sys
import time

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction


def replicate_config(req):
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    if req.get("soft_pin"):
        cfg.soft_pin_action = SoftPinAction.ENABLE
        if req.get("ttl_ms"):
            cfg.soft_pin_ttl_ms = int(req["ttl_ms"])
    if req.get("hard_pin"):
        cfg.with_hard_pin = True
    if req.get("group"):
        cfg.group_ids = [req["group"]]
    return cfg


def main():
    hostname, metadata, master, segment, local_buf = sys.argv[1:6]
    out = os.fdopen(3, "w", buffering=1)
    store = MooncakeDistributedStore()
    rc = store.setup(hostname, metadata, int(segment), int(local_buf), "tcp", "", master)
    out.write(json.dumps({"op": "setup", "rc": rc}) + "\n")
    if rc != 0:
        return 1
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        op = req.get("op")
        rep = {"op": op}
        try:
            if op == "quit":
                store.close()
                out.write(json.dumps({"op": op, "rc": 0}) + "\n")
                return 0
            if op == "put":
                with open(req["file"], "rb") as f:
                    data = f.read()
                rep["rc"] = store.put(req["key"], data, replicate_config(req))
            elif op == "get":
                data = store.get(req["key"])
                with open(req["file"], "wb") as f:
                    f.write(data)
                rep["rc"] = 0
                rep["size"] = len(data)
            elif op == "is_exist":
                rep["rc"] = store.is_exist(req["key"])
            elif op == "batch_is_exist":
                rep["results"] = list(store.batch_is_exist(req["keys"]))
                rep["rc"] = 0
            elif op == "remove":
                rep["rc"] = store.remove(req["key"], bool(req.get("force")))
            elif op == "bench_put":
                data = os.urandom(int(req["size"]))
                n = int(req["n"])
                start = time.perf_counter_ns()
                failed = 0
                for i in range(n):
                    if store.put("%s/%d" % (req["prefix"], i), data) != 0:
                        failed += 1
                rep["ns"] = time.perf_counter_ns() - start
                rep["rc"] = -failed
            elif op == "bench_get":
                n = int(req["n"])
                size = int(req["size"])
                start = time.perf_counter_ns()
                bad = 0
                for i in range(n):
                    if len(store.get("%s/%d" % (req["prefix"], i))) != size:
                        bad += 1
                rep["ns"] = time.perf_counter_ns() - start
                rep["rc"] = -bad
            elif op == "bench_put_batch":
                data = os.urandom(int(req["size"]))
                n, batch = int(req["n"]), int(req["batch"])
                start = time.perf_counter_ns()
                failed = 0
                for i in range(n):
                    keys = ["%s/%d/%d" % (req["prefix"], i, j) for j in range(batch)]
                    if store.put_batch(keys, [data] * batch) != 0:
                        failed += 1
                rep["ns"] = time.perf_counter_ns() - start
                rep["rc"] = -failed
            elif op == "bench_get_batch":
                n, batch, size = int(req["n"]), int(req["batch"]), int(req["size"])
                start = time.perf_counter_ns()
                bad = 0
                for i in range(n):
                    keys = ["%s/%d/%d" % (req["prefix"], i, j) for j in range(batch)]
                    for h in store.batch_get_buffer(keys):
                        if h is None or h.size() != size:
                            bad += 1
                rep["ns"] = time.perf_counter_ns() - start
                rep["rc"] = -bad
            elif op == "bench_exist":
                # keys[:present] are stored and the rest are not; each result's first and last
                # entries are checked, as the Go side checks its own.
                keys = req["keys"]
                n, present = int(req["n"]), int(req["present"])
                first, last = int(present > 0), int(present >= len(keys))
                start = time.perf_counter_ns()
                bad = 0
                for _ in range(n):
                    r = store.batch_is_exist(keys)
                    if r[0] != first or r[-1] != last:
                        bad += 1
                rep["ns"] = time.perf_counter_ns() - start
                rep["rc"] = -bad
            else:
                rep["error"] = "unknown op %r" % op
        except Exception as e:  # reported to the test, which fails on it
            rep["error"] = "%s: %s" % (type(e).__name__, e)
        out.write(json.dumps(rep) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
