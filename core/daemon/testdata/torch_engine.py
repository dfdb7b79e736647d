"""Plays an inference engine against `kvctl serve`, with its KV pool in a PyTorch CUDA tensor.

The pool is handed to the daemon through a legacy CUDA IPC handle (cuda_ipc in Register). The
script runs a cold pass of N requests, writing deterministic KV bytes on the GPU for every block
it computes, then registers a second engine (a new name, a fresh tensor) that runs the same
prompts warm and checks every page the daemon loaded, byte for byte, on the GPU.

It prints one line `SUMMARY {json}` and exits 0 only when the warm pass loaded something and
every loaded page held the bytes the cold pass computed.

It is an engine built on the repository's engine SDK (clients/python, import kvctl_engine): a
Rank registered over a Client, its KV memory a kvctl_engine.SharedMemory or a CUDA tensor's
CudaIpcMemory. When kvctl_engine is not installed the script imports it from the repository's
clients/python, so any interpreter with grpcio and protobuf runs it.

`--memory shm` keeps the pool in a shared-memory file instead (no PyTorch, no GPU): it runs the
same request lifecycle and is there to check the script on a machine without a GPU.

`--calls channel` (the default) makes the engine calls over a call channel (OpenCallChannel in
engine.proto): a unix SOCK_SEQPACKET socket pair whose one end goes to the daemon over the
descriptor side channel, each call one message of frames written and one read, instead of an
HTTP/2 stream; `--calls grpc` makes them as plain gRPC calls. A request larger than the
channel takes (OpenCallChannel's max_message_bytes) goes over gRPC either way. Errors surface
the same way on both: the SDK's KvctlError with the daemon's status code and message. Every run
times a plain call on the idle daemon over both transports, checks that a failing call reads
the same over both, and ends by checking that the daemon closes the channel once the gRPC
connection that opened it has ended.

`--bench-calls N` only registers an engine, then reads lines from stdin: for each line holding a
count n it makes n plain calls over each transport (interleaved in chunks) and prints one line
`BENCH {json}` with the mean seconds per call of each; it stops at the end of its input.
"""

import argparse
import array
import gc
import hashlib
import json
import os
import random
import sys
import time
import urllib.request
from dataclasses import asdict

try:
    import kvctl_engine as kv
except ImportError:  # run from the repository without the SDK installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "clients", "python"))
    import kvctl_engine as kv
from kvctl_engine._pb import engine_pb2 as pb

# The timeout of every call the passes make: generous, the GPU run's loads are large.
CALL_TIMEOUT = 120.0


def call_via(client, via, method, timeout=CALL_TIMEOUT, **fields):
    """One engine API call over the transport via ("grpc" or "channel"), its request built from
    fields: the per-transport calls the summary compares."""
    req_cls = getattr(pb, pb.DESCRIPTOR.services_by_name["Engine"].methods_by_name[method].input_type.name)
    return client.call(method, req_cls(**fields), timeout, via=via)


def blake_seed(tokens):
    d = hashlib.blake2b(array.array("q", tokens).tobytes(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 62) - 1)


class CudaMemory:
    """The KV pool as one CUDA tensor: region l of slot s is bytes [l][s] of a (L, slots, piece) view."""

    def __init__(self, layers, slots, piece, lead=4096):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.size = layers * slots * piece
        # The pool starts inside the allocation, so the offset in the registration matters.
        self.base = torch.empty(lead + self.size, dtype=torch.uint8, device=self.dev)
        self.mem = self.base[lead:]
        self.regions = self.mem.view(layers, slots, piece)
        self.layers, self.piece = layers, piece
        self.page_bytes = layers * piece
        self.mem.fill_(0xEE)
        torch.cuda.synchronize()

    def registration(self):
        """The memory to register (the SDK's CudaIpcMemory of the pool's bytes) and what the
        summary records of it."""
        ipc = kv.ipc_handle_from_tensor(self.mem)
        return ipc, {"kind": "cuda_ipc", "handle_bytes": len(ipc.handle), "offset": ipc.offset, "size": ipc.size}

    def value(self, seed):
        t = self.torch
        x = t.arange(self.page_bytes // 8, dtype=t.int64, device=self.dev)
        x = (x + seed) * 6364136223846793005
        x = x ^ (x >> 29)
        x = x * 1442695040888963407
        x = x ^ (x >> 32)
        return x.view(t.uint8).view(self.layers, self.piece)

    def poison(self, slots):
        if slots:
            idx = self.torch.tensor(slots, dtype=self.torch.int64, device=self.dev)
            self.regions[:, idx, :] = 0xEE

    def write(self, slot, seed):
        self.regions[:, slot, :] = self.value(seed)

    def mismatches(self, slot, seed):
        got = self.regions[:, slot, :]
        want = self.value(seed)
        if self.torch.equal(got, want):
            return 0
        return int((got != want).sum().item())

    def sync(self):
        self.torch.cuda.synchronize()

    def busy(self, seconds):
        """Keeps the GPU computing for about seconds, then waits for it: what the previous
        step's forward pass leaves behind when an engine calls StartLoad."""
        t = self.torch
        if not hasattr(self, "_busy"):
            self._busy = t.randn(2048, 2048, device=self.dev, dtype=t.float16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(4):
                self._busy @ self._busy
            t.cuda.synchronize()

    def close(self):
        self.sync()
        del self.regions, self.mem, self.base


class ShmMemory:
    """The KV pool in a shared-memory file (no GPU): the same layout, bytes from SHAKE-256."""

    def __init__(self, layers, slots, piece):
        self.layers, self.slots, self.piece = layers, slots, piece
        self.size = layers * slots * piece
        self.page_bytes = layers * piece
        # A memfd sealed against shrinking and growing, as kvctl serve requires.
        self.shm = kv.SharedMemory(self.size, "torch-engine-kv")
        self.map = self.shm.buf

    def registration(self):
        return self.shm, {"kind": "shared_memory", "size": self.size}

    def value(self, seed):
        return hashlib.shake_256(seed.to_bytes(8, "little")).digest(self.page_bytes)

    def _pieces(self, slot):
        for layer in range(self.layers):
            off = (layer * self.slots + slot) * self.piece
            yield layer * self.piece, off

    def poison(self, slots):
        for s in slots:
            for _, off in self._pieces(s):
                self.map[off : off + self.piece] = b"\xee" * self.piece

    def write(self, slot, seed):
        v = self.value(seed)
        for voff, off in self._pieces(slot):
            self.map[off : off + self.piece] = v[voff : voff + self.piece]

    def mismatches(self, slot, seed):
        v = self.value(seed)
        bad = 0
        for voff, off in self._pieces(slot):
            got = self.map[off : off + self.piece]
            want = v[voff : voff + self.piece]
            if got != want:
                bad += sum(1 for a, b in zip(got, want, strict=True) if a != b)
        return bad

    def sync(self):
        pass

    def busy(self, seconds):
        pass

    def close(self):
        self.shm.close()


def prompts(seed, n, T, min_blocks, max_blocks):
    """n prompts of min..max full blocks plus a partial tail; every third shares its first two
    blocks with the one before, as turns of a conversation do."""
    rng = random.Random(seed)
    out, prev = [], None
    for i in range(n):
        toks = list(prev[: 2 * T]) if (i % 3 == 2 and prev is not None) else []
        want = rng.randint(min_blocks, max_blocks) * T + rng.randint(1, T - 1)
        while len(toks) < want:
            toks.append(rng.randrange(150000))
        prev = toks
        out.append(("req-%d" % i, toks))
    return out


WAITING, RUNNING, SAVING, DONE = range(4)


class Req:
    def __init__(self, rid, tokens):
        self.id, self.tokens = rid, tokens
        self.reset()

    def reset(self):
        self.phase = WAITING
        self.pages = None
        self.sent = 0
        self.computed = 0
        self.restore = 0
        self.written = 0
        self.saved = False


class Engine:
    """One engine rank (world size 1, scheduler adapter on) with its own KV pool."""

    def __init__(self, client, args, name, mem):
        self.client, self.args, self.name, self.mem = client, args, name, mem
        self.T = args.tokens_per_block
        self.free = list(range(args.slots - 1, -1, -1))
        piece = args.page_bytes // args.layers
        regions = [kv.Region(offset=i * args.slots * piece, stride=piece, size=piece) for i in range(args.layers)]
        layout = kv.Layout(tokens_per_block=self.T, groups=[kv.LayerGroup(id=0, slots=args.slots, regions=regions)])
        memory, self.memory_info = mem.registration()
        self.rank = kv.Rank.register(
            client,
            name,
            layout,
            memory,
            model_key=args.model_key,
            role="both",
            scheduler=True,
            options=kv.RankOptions(transfer_batch_size=args.transfer_batch, staging_buffer_bytes=args.staging_bytes),
            timeout=CALL_TIMEOUT,
        )
        self.shard = self.rank.shard

    def seed(self, r, b):
        return blake_seed(r.tokens[: (b + 1) * self.T])

    def allocate(self, r):
        blocks = (len(r.tokens) + self.T - 1) // self.T
        if len(self.free) < blocks:
            raise RuntimeError("request %s needs %d slots, %d free: raise --slots" % (r.id, blocks, len(self.free)))
        r.pages = self.free[len(self.free) - blocks :][::-1]
        del self.free[len(self.free) - blocks :]
        self.mem.poison(r.pages)  # so a load that writes nothing is caught

    def release(self, r):
        self.free.extend(r.pages)
        r.pages = None

    def block_ids(self, r, start):
        return [r.pages[start:]]

    def run(self, reqs):
        # Python's collector stays off during a pass, as in a serving engine's step loop: a
        # collection that lands inside a timed StartLoad is this process's pause, not the
        # daemon's. What a pass leaves for the collector is collected after it.
        gc.collect()
        gc.disable()
        try:
            return self._run(reqs)
        finally:
            gc.enable()

    def _run(self, reqs):
        a, rank, T, t = self.args, self.rank, self.T, CALL_TIMEOUT
        res = dict(
            requests=len(reqs),
            passes=0,
            prompt_tokens=0,
            matched_tokens=0,
            loaded_blocks=0,
            computed_blocks=0,
            restarts=0,
            mismatched_blocks=0,
            mismatched_bytes=0,
            start_load_seconds=0.0,
            start_loads=0,
            rpc_seconds=0.0,
            loaded_bytes=0,
            wall_seconds=0.0,
            start_load_each=[],
        )
        rs = [Req(rid, toks) for rid, toks in reqs]
        by_id = {r.id: r for r in rs}
        res["prompt_tokens"] = sum(len(r.tokens) for r in rs)
        t0 = time.perf_counter()
        deadline = time.monotonic() + a.pass_timeout
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError("pass made no progress within %ds" % a.pass_timeout)
            if all(r.phase == DONE for r in rs):
                break
            res["passes"] += 1
            running = sum(1 for r in rs if r.phase in (RUNNING, SAVING))

            # Admit waiting requests.
            for r in rs:
                if r.phase != WAITING or running >= a.max_running:
                    continue
                lr = rank.lookup(kv.Request(r.id, r.tokens, context_only=True), 0, t)
                self.allocate(r)
                h = lr.matched_tokens
                rank.update_state_after_alloc(r.id, self.block_ids(r, 0), h, t)
                r.phase, r.restore = RUNNING, h
                res["matched_tokens"] += h
                running += 1

            # This pass's metadata.
            new, cached, scheduled = [], [], {}
            for r in rs:
                if r.phase != RUNNING:
                    continue
                n = min(a.chunk_blocks * T, len(r.tokens) - r.computed - r.restore)
                rd = kv.RequestData(r.id, self.block_ids(r, r.sent), r.computed, n)
                (new if r.sent == 0 else cached).append(rd)
                r.sent = len(r.pages)
                scheduled[r.id] = n
            subs = rank.take_submitted_saves(t)
            meta = rank.build_meta(new, cached, subs, t)
            rank.bind_meta(meta, t)
            self.mem.sync()  # the poison must land before the daemon's copies
            if a.busy_ms > 0:
                self.mem.busy(a.busy_ms / 1000)
            t1 = time.perf_counter()
            rank.start_load(t)
            t2 = time.perf_counter()
            res["start_load_seconds"] += t2 - t1
            res["start_loads"] += 1
            # Each StartLoad's seconds and the pages it restores, to tell a slow first load
            # from a uniformly slow one.
            res["start_load_each"].append([t2 - t1, sum(r.restore // T for r in rs if r.id in scheduled)])
            failed = rank.take_failed_loads(t)
            # A call that does next to nothing in the daemon: the RPC's own cost, for comparison.
            res["rpc_seconds"] += time.perf_counter() - t2
            for rid in failed:
                r = by_id[rid]
                scheduled.pop(rid, None)
                rank.request_reset(rid, t)
                self.release(r)
                res["matched_tokens"] -= r.restore
                r.reset()
                res["restarts"] += 1

            # Compute: check restored blocks, write the KV of newly computed ones.
            finished_gen = []
            for r in rs:
                if r.id not in scheduled:
                    continue
                n = scheduled[r.id]
                if r.restore > 0:
                    for b in range(r.computed // T, (r.computed + r.restore) // T):
                        bad = self.mem.mismatches(r.pages[b], self.seed(r, b))
                        if bad:
                            res["mismatched_blocks"] += 1
                            res["mismatched_bytes"] += bad
                            if res["mismatched_blocks"] <= 5:
                                print(
                                    "mismatch: request %s block %d slot %d: %d bytes differ"
                                    % (r.id, b, r.pages[b], bad),
                                    file=sys.stderr,
                                )
                        res["loaded_blocks"] += 1
                        res["loaded_bytes"] += self.mem.page_bytes
                    r.written = (r.computed + r.restore) // T
                r.computed += r.restore + n
                r.restore = 0
                for b in range(r.written, r.computed // T):
                    self.mem.write(r.pages[b], self.seed(r, b))
                    res["computed_blocks"] += 1
                r.written = max(r.written, r.computed // T)
            self.mem.sync()  # the KV must be in memory before the daemon may save it
            for r in rs:
                if r.id in scheduled and r.computed == len(r.tokens):
                    if rank.request_finished(r.id, t):
                        r.phase = SAVING
                        finished_gen.append(r.id)
                    else:
                        r.phase = DONE
                        self.release(r)

            rank.wait_for_save(t)
            gf = rank.get_finished(finished_gen, (), t)
            for rid in gf.finished_saving:
                if rid in by_id:
                    by_id[rid].saved = True
            idle = True
            for r in rs:
                if r.phase == SAVING and r.saved:
                    r.phase = DONE
                    self.release(r)
                if r.phase in (RUNNING, WAITING):
                    idle = False
            if idle:
                time.sleep(0.0002)  # only saves in flight
        res["wall_seconds"] = time.perf_counter() - t0
        return res

    def close(self):
        self.rank.unregister(CALL_TIMEOUT)


def pinned_anchor(torch, nbytes=64 << 20, reps=20):
    """The same run's link anchor: GB/s (10^9 bytes/s) of one pinned nbytes copy host->device and
    device->host, median of reps timed with CUDA events after three warm-up copies."""
    host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        times = []
        for i in range(reps + 3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            if i >= 3:
                times.append(a.elapsed_time(b) / 1e3)
        times.sort()
        out[name + "_64mib_gbs"] = nbytes / times[len(times) // 2] / 1e9
    del host, dev
    return out


def large_calls(client, engine, seed, prefix):
    """Calls of requests larger than a frame, and one larger than the channel takes: a Lookup of
    a 32k-token prompt that starts with a saved prompt (prefix) over each transport (the answers
    must agree and match the saved blocks), then a prompt over the
    channel's max_message_bytes, which the channel must refuse (RESOURCE_EXHAUSTED) and call()
    sends over gRPC instead, and a plain call over the channel after it."""
    rng = random.Random(seed + 7)
    out = {}
    toks = list(prefix) + [rng.randrange(150000) for _ in range((32 << 10) - len(prefix))]
    for via in ("grpc", "channel"):
        req = pb.Request(id="large-32k-" + via, tokens_packed=kv.pack_tokens(toks))
        r = call_via(client, via, "Lookup", engine=engine, num_computed_tokens=0, request=req)
        out["lookup_32k_" + via] = r.matched_tokens
    # Past the bound by one token's bytes and a little more for the other fields.
    toks = [rng.randrange(150000) for _ in range(client.call_channel.max_message // 8 + 1)]
    req = pb.Request(id="large-over", tokens_packed=kv.pack_tokens(toks))
    try:
        call_via(client, "channel", "Lookup", engine=engine, num_computed_tokens=0, request=req)
        out["over_channel_error"] = None
    except kv.KvctlError as e:
        out["over_channel_error"] = {"code": e.code.name, "details": e.details}
    out["over_bytes"] = len(pb.LookupRequest(engine=engine, request=req).SerializeToString())
    # "auto" routes a request above the channel's bound over gRPC.
    out["over_routed_matched"] = call_via(
        client, "auto", "Lookup", engine=engine, num_computed_tokens=0, request=req
    ).matched_tokens
    call_via(client, "channel", "TakeFailedLoads", engine=engine)
    out["channel_after_over"] = "ok"
    return out


def channel_after_connection_end(client, engine, wait=10.0):
    """Ends the gRPC connection that opened the call channel and calls over the channel until
    the daemon has closed it, as it must when that connection ends: the error and how long it
    took to come."""
    # Only the gRPC connection: the channel stays open on this side.
    client._grpc.close()
    t0 = time.monotonic()
    while True:
        try:
            call_via(client, "channel", "TakeFailedLoads", timeout=wait, engine=engine)
        except kv.KvctlError as e:
            if isinstance(e, kv.DaemonUnavailable) or time.monotonic() - t0 > wait:
                return {"code": e.code.name, "details": e.details, "seconds": time.monotonic() - t0}
        if time.monotonic() - t0 > wait:
            return {
                "code": "OK",
                "details": "the channel still answered %.0fs after its connection ended" % wait,
                "seconds": time.monotonic() - t0,
            }
        time.sleep(0.001)


def time_calls(client, via, engine, n):
    """The mean seconds of n calls that do next to nothing in the daemon, over via, as an engine
    makes them through the SDK (the request built, sent, answered, decoded)."""
    ref = pb.EngineRef(engine=engine)
    call = client.call
    t0 = time.perf_counter()
    for _ in range(n):
        call("TakeFailedLoads", ref, CALL_TIMEOUT, via)
    return (time.perf_counter() - t0) / n


def bench_lookups(e, n, prompt):
    """n lookups of prompt through the SDK's Rank (the prompt written into the rank's prompt
    arena, the call over its call channel), each under a new request id and reset afterwards:
    the mean seconds of the lookup alone and the tokens it matched."""
    took, matched = 0.0, -1
    for i in range(n):
        rid = "bench-lookup-%d" % i
        t0 = time.perf_counter()
        res = e.rank.lookup(kv.Request(rid, prompt, context_only=True), 0, CALL_TIMEOUT)
        took += time.perf_counter() - t0
        matched = res.matched_tokens
        e.rank.request_reset(rid, CALL_TIMEOUT)
    return {"lookups": n, "tokens": len(prompt), "lookup_seconds": took / n, "matched_tokens": matched}


def bench_calls(client, args):
    """--bench-calls: registers an engine, then for each count n read from stdin makes n plain
    calls over each transport, in interleaved chunks so that both see the same machine, and
    prints their mean seconds a call as `BENCH {json}`. A line `lookup N FILE` makes N lookups
    of the prompt in FILE (a JSON array of token ids) instead (bench_lookups)."""
    args.slots = args.slots or 4
    mem = new_memory(args)
    e = Engine(client, args, args.name + "-bench/rank0", mem)
    for via in ("grpc", "channel"):
        time_calls(client, via, e.name, args.bench_calls)  # warm-up
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if line.startswith("lookup "):
            _, n, path = line.split()
            with open(path) as f:
                prompt = json.load(f)
            print("BENCH " + json.dumps(bench_lookups(e, int(n), prompt)), flush=True)
            continue
        n = int(line)
        took = {"grpc": 0.0, "channel": 0.0}
        done = 0
        while done < n:
            k = min(100, n - done)
            for via in ("grpc", "channel"):
                took[via] += time_calls(client, via, e.name, k) * k
            done += k
        out = {"calls": n, "grpc_seconds": took["grpc"] / n, "channel_seconds": took["channel"] / n}
        print("BENCH " + json.dumps(out), flush=True)
    e.close()
    mem.close()
    client.close()
    return 0


def new_memory(args):
    piece = args.page_bytes // args.layers
    if args.memory == "cuda":
        return CudaMemory(args.layers, args.slots, piece)
    return ShmMemory(args.layers, args.slots, piece)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the daemon's engine socket")
    p.add_argument("--stats-url", default="", help="the daemon's /v1/stats, read before the warm engine unregisters")
    p.add_argument("--memory", choices=["cuda", "shm"], default="cuda")
    p.add_argument("--model-key", default="torch-model")
    p.add_argument("--name", default="torch")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tokens-per-block", type=int, default=32)
    p.add_argument("--min-blocks", type=int, default=8)
    p.add_argument("--max-blocks", type=int, default=16)
    p.add_argument("--page-bytes", type=int, default=1 << 20)
    p.add_argument("--layers", type=int, default=2, help="regions a page is split into (one per layer)")
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--chunk-blocks", type=int, default=4, help="blocks a request computes per pass")
    p.add_argument("--slots", type=int, default=0, help="page slots (0: enough for --max-running requests)")
    p.add_argument("--transfer-batch", type=int, default=0)
    p.add_argument(
        "--busy-ms",
        type=float,
        default=0,
        help="keep the GPU computing this long before each StartLoad, as the previous step's forward pass does in a serving engine (0: the GPU idles between passes)",
    )
    p.add_argument(
        "--passes",
        choices=["both", "cold", "warm"],
        default="both",
        help="run the cold pass, the warm pass or both (a warm pass alone loads what a cold pass with the same --seed saved, through this or another daemon of the same pool)",
    )
    p.add_argument("--staging-bytes", type=int, default=256 << 20)
    p.add_argument("--pass-timeout", type=int, default=300)
    p.add_argument(
        "--spin-us",
        type=float,
        default=0,
        help="microseconds a call channel call polls for its response before sleeping in recv",
    )
    p.add_argument(
        "--calls",
        choices=["channel", "grpc"],
        default="channel",
        help="the transport of engine calls: a call channel or plain gRPC",
    )
    p.add_argument(
        "--bench-calls",
        type=int,
        default=0,
        help="time plain calls over both transports for counts read from stdin (N: warm-up calls)",
    )
    args = p.parse_args()
    if args.page_bytes % (8 * args.layers):
        p.error("--page-bytes must be a multiple of 8 * --layers")
    if args.slots == 0:
        args.slots = args.max_running * (args.max_blocks + 1)

    # A channel is opened whichever transport runs, so both can be timed; --calls picks the one
    # the passes' calls take.
    client = kv.connect(args.socket, timeout=CALL_TIMEOUT, call_channel=False)
    opened = client.open_call_channel()
    client.call_channel.spin = args.spin_us / 1e6
    client.via = "auto" if args.calls == "channel" else "grpc"
    if args.bench_calls:
        return bench_calls(client, args)
    reqs = prompts(args.seed, args.requests, args.tokens_per_block, args.min_blocks, args.max_blocks)
    T = args.tokens_per_block
    # The same failing call over each transport: the error must read the same.
    errors = {}
    for via in ("grpc", "channel"):
        try:
            call_via(client, via, "TakeFailedLoads", engine=args.name + "-never-registered/rank0")
            errors[via] = None
        except kv.KvctlError as e:
            errors[via] = {"code": e.code.name, "details": e.details}
    summary = {
        "memory": args.memory,
        "page_bytes": args.page_bytes,
        "layers": args.layers,
        "busy_ms": args.busy_ms,
        "tokens_per_block": T,
        "slots": args.slots,
        "max_running": args.max_running,
        "calls": args.calls,
        "spin_us": args.spin_us,
        "unregistered_call_errors": errors,
        "call_channel": {"max_frame_bytes": opened.max_frame_bytes, "max_message_bytes": opened.max_message_bytes},
    }
    if args.memory == "cuda":
        import torch

        summary["torch"] = torch.__version__
        summary["gpu"] = torch.cuda.get_device_name()
        summary["anchor"] = pinned_anchor(torch)

    summary["passes"] = args.passes
    last = None
    if args.passes in ("both", "cold"):
        # Cold pass: computes and saves every block.
        mem = new_memory(args)
        cold = Engine(client, args, args.name + "-cold/rank0", mem)
        summary["registration"] = cold.memory_info
        summary["cold"] = cold.run(reqs)
        summary["large_calls"] = large_calls(client, cold.name, args.seed, reqs[0][1])
        last = cold.name  # run() returns once every save is done: a warm pass may follow at once
        cold.close()
        mem.close()

    if args.passes in ("both", "warm"):
        # Warm pass: a new engine with fresh memory loads what the cold pass saved.
        mem = new_memory(args)
        warm = Engine(client, args, args.name + "-warm/rank0", mem)
        # An engine call's own cost on an idle daemon, over each transport: calls that do next
        # to nothing there.
        for via in ("grpc", "channel"):
            summary["idle_rpc_seconds_" + via] = time_calls(client, via, warm.name, 200)
        summary["idle_rpc_seconds"] = summary["idle_rpc_seconds_" + args.calls]
        summary["warm"] = warm.run([(rid + "-warm", toks) for rid, toks in reqs])
        # Every full block but the one holding the last prompt token is offered.
        summary["expected_warm_loaded_blocks"] = sum((len(t) - 1) // T for _, t in reqs)
        if args.stats_url:
            with urllib.request.urlopen(args.stats_url, timeout=30) as resp:
                summary["daemon_loads"] = json.load(resp)["loads"]
        last = warm.name
        warm.close()
        mem.close()
    summary["call_channel_stats"] = asdict(client.call_channel.stats)
    summary["channel_after_connection_end"] = channel_after_connection_end(client, last)
    client.close()

    if args.memory == "cuda":
        # Measured again after the passes: the anchor brackets the loads.
        after = pinned_anchor(torch)
        summary["anchor_after"] = after
    problems = []
    if any(summary[k]["mismatched_blocks"] for k in ("cold", "warm") if k in summary):
        problems.append("loaded pages held wrong bytes")
    if "warm" in summary and summary["warm"]["loaded_blocks"] == 0:
        problems.append("the warm pass loaded nothing")
    summary["ok"] = not problems
    summary["problems"] = problems
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
