"""Plays an inference engine against `kvctl serve`, with its KV pool in a PyTorch CUDA tensor.

The pool is handed to the daemon through a legacy CUDA IPC handle (cuda_ipc in Register). The
script runs a cold pass of N requests, writing deterministic KV bytes on the GPU for every block
it computes, then registers a second engine (a new name, a fresh tensor) that runs the same
prompts warm and checks every page the daemon loaded, byte for byte, on the GPU.

It prints one line `SUMMARY {json}` and exits 0 only when the warm pass loaded something and
every loaded page held the bytes the cold pass computed.

No generated Python stubs are needed: the messages are built at run time from engine.pb, a
FileDescriptorSet made with

    protoc --include_imports --descriptor_set_out=core/daemon/testdata/engine.pb \
        -I core/engineapi core/engineapi/engine.proto

`--memory shm` keeps the pool in a shared-memory file instead (no PyTorch, no GPU): it runs the
same request lifecycle and is there to check the script on a machine without a GPU.
"""
import argparse
import array
import fcntl
import hashlib
import json
import mmap
import os
import random
import socket
import sys
import tempfile
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PKG = "kvctl.engine.v1"
SERVICE = PKG + ".Engine"


class API:
    """The Engine service's messages and methods, from a FileDescriptorSet."""

    def __init__(self, descriptor_path, socket_path):
        with open(descriptor_path, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            self.pool.AddSerializedFile(fd.SerializeToString())
        self._classes = {}
        self.channel = grpc.insecure_channel(
            "unix:" + os.path.abspath(socket_path),
            options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
        )
        service = self.pool.FindServiceByName(SERVICE)
        self._methods = {}
        for m in service.methods:
            self._methods[m.name] = self.channel.unary_unary(
                "/%s/%s" % (SERVICE, m.name),
                request_serializer=lambda msg: msg.SerializeToString(),
                response_deserializer=self.cls(m.output_type.full_name).FromString,
            )
        self._inputs = {m.name: m.input_type.full_name for m in service.methods}

    def cls(self, name):
        if "." not in name:
            name = PKG + "." + name
        c = self._classes.get(name)
        if c is None:
            d = self.pool.FindMessageTypeByName(name)
            if hasattr(message_factory, "GetMessageClass"):
                c = message_factory.GetMessageClass(d)
            else:
                c = message_factory.MessageFactory(self.pool).GetPrototype(d)
            self._classes[name] = c
        return c

    def msg(self, name, **kw):
        return self.cls(name)(**kw)

    def call(self, method, timeout=120, **kw):
        req = self.cls(self._inputs[method])(**kw)
        return self._methods[method](req, timeout=timeout)

    def close(self):
        self.channel.close()


def pack_tokens(tokens):
    """tokens as Request.tokens_packed: 8 bytes a token, little-endian int64."""
    a = array.array("q", tokens)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


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

    def register_fields(self, api):
        shared = self.mem.untyped_storage()._share_cuda_()
        handle, storage_offset = shared[1], shared[3]
        offset = storage_offset + self.mem.storage_offset() * self.mem.element_size()
        ipc = api.msg("CudaIPC", handle=handle, offset=offset, size=self.size, device=self.dev.index)
        return {"cuda_ipc": ipc}, {"kind": "cuda_ipc", "handle_bytes": len(handle), "offset": offset, "size": self.size}

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

    def close(self):
        self.sync()
        del self.regions, self.mem, self.base


class ShmMemory:
    """The KV pool in a shared-memory file (no GPU): the same layout, bytes from SHAKE-256."""

    def __init__(self, layers, slots, piece):
        self.layers, self.slots, self.piece = layers, slots, piece
        self.size = layers * slots * piece
        self.page_bytes = layers * piece
        # kvctl serve accepts only a memfd sealed against shrinking: memory truncated under its
        # mapping would fault in the daemon.
        self.fd = os.memfd_create("torch-engine-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.size)
        F_ADD_SEALS, F_SEAL_SHRINK, F_SEAL_GROW = 1033, 0x0002, 0x0004
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, self.size)

    def register_fields(self, api):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.socket_path + ".fd")
        socket.send_fds(s, [b"\0"], [self.fd])
        token = s.recv(256).decode()
        s.close()
        if len(token) != 32:
            raise RuntimeError("descriptor channel: " + token)
        shm = api.msg("SharedMemory", fd_token=token, size=self.size)
        return {"shared_memory": shm}, {"kind": "shared_memory", "size": self.size}

    def value(self, seed):
        return hashlib.shake_256(seed.to_bytes(8, "little")).digest(self.page_bytes)

    def _pieces(self, slot):
        for l in range(self.layers):
            off = (l * self.slots + slot) * self.piece
            yield l * self.piece, off

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
                bad += sum(1 for a, b in zip(got, want) if a != b)
        return bad

    def sync(self):
        pass

    def close(self):
        self.map.close()
        os.close(self.fd)


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

    def __init__(self, api, args, name, mem):
        self.api, self.args, self.name, self.mem = api, args, name, mem
        self.T = args.tokens_per_block
        self.free = list(range(args.slots - 1, -1, -1))
        piece = args.page_bytes // args.layers
        regions = [api.msg("Region", offset=l * args.slots * piece, stride=piece, size=piece) for l in range(args.layers)]
        layout = api.msg(
            "Layout",
            tokens_per_block=self.T,
            groups=[api.msg("LayerGroup", id=0, slots=args.slots, regions=regions)],
        )
        memory, self.memory_info = mem.register_fields(api)
        resp = api.call(
            "Register",
            engine=name,
            model_key=args.model_key,
            world_size=1,
            rank=0,
            role="both",
            scheduler=True,
            layout=layout,
            transfer_batch_size=args.transfer_batch,
            staging_buffer_bytes=args.staging_bytes,
            **memory,
        )
        self.shard = resp.shard

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
        return [self.api.msg("BlockIDs", ids=r.pages[start:])]

    def run(self, reqs):
        a, api, name, T = self.args, self.api, self.name, self.T
        res = dict(requests=len(reqs), passes=0, prompt_tokens=0, matched_tokens=0, loaded_blocks=0,
                   computed_blocks=0, restarts=0, mismatched_blocks=0, mismatched_bytes=0,
                   start_load_seconds=0.0, start_loads=0, rpc_seconds=0.0, loaded_bytes=0, wall_seconds=0.0)
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
                lr = api.call("Lookup", engine=name, num_computed_tokens=0,
                              request=api.msg("Request", id=r.id, tokens_packed=pack_tokens(r.tokens), context_only=True))
                self.allocate(r)
                h = lr.matched_tokens
                api.call("UpdateStateAfterAlloc", engine=name, request_id=r.id,
                         block_ids_by_group=self.block_ids(r, 0), honoured_tokens=h)
                r.phase, r.restore = RUNNING, h
                res["matched_tokens"] += h
                running += 1

            # This pass's metadata.
            new, cached, scheduled = [], [], {}
            for r in rs:
                if r.phase != RUNNING:
                    continue
                n = min(a.chunk_blocks * T, len(r.tokens) - r.computed - r.restore)
                rd = api.msg("RequestData", id=r.id, computed_position=r.computed, num_scheduled_tokens=n,
                             new_block_ids_by_group=self.block_ids(r, r.sent))
                (new if r.sent == 0 else cached).append(rd)
                r.sent = len(r.pages)
                scheduled[r.id] = n
            subs = api.call("TakeSubmittedSaves", engine=name)
            meta = api.call("BuildMeta", engine=name, new_requests=new, cached_requests=cached,
                            submitted_saves=list(subs.ids))
            api.call("BindMeta", engine=name, metadata=meta)
            self.mem.sync()  # the poison must land before the daemon's copies
            t1 = time.perf_counter()
            api.call("StartLoad", engine=name)
            t2 = time.perf_counter()
            res["start_load_seconds"] += t2 - t1
            res["start_loads"] += 1
            failed = api.call("TakeFailedLoads", engine=name)
            # A call that does next to nothing in the daemon: the RPC's own cost, for comparison.
            res["rpc_seconds"] += time.perf_counter() - t2
            for rid in failed.ids:
                r = by_id[rid]
                scheduled.pop(rid, None)
                api.call("RequestReset", engine=name, request_id=rid)
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
                                print("mismatch: request %s block %d slot %d: %d bytes differ" % (r.id, b, r.pages[b], bad), file=sys.stderr)
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
                    fr = api.call("RequestFinished", engine=name, request_id=r.id)
                    if fr.async_saving:
                        r.phase = SAVING
                        finished_gen.append(r.id)
                    else:
                        r.phase = DONE
                        self.release(r)

            api.call("WaitForSave", engine=name)
            gf = api.call("GetFinished", engine=name, finished_gen=finished_gen)
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
        self.api.call("Unregister", engine=self.name, timeout=120)


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


def new_memory(args):
    piece = args.page_bytes // args.layers
    if args.memory == "cuda":
        return CudaMemory(args.layers, args.slots, piece)
    m = ShmMemory(args.layers, args.slots, piece)
    m.socket_path = os.path.abspath(args.socket)
    return m


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the daemon's engine socket")
    p.add_argument("--descriptor", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine.pb"))
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
    p.add_argument("--staging-bytes", type=int, default=256 << 20)
    p.add_argument("--pass-timeout", type=int, default=300)
    args = p.parse_args()
    if args.page_bytes % (8 * args.layers):
        p.error("--page-bytes must be a multiple of 8 * --layers")
    if args.slots == 0:
        args.slots = args.max_running * (args.max_blocks + 1)

    api = API(args.descriptor, args.socket)
    reqs = prompts(args.seed, args.requests, args.tokens_per_block, args.min_blocks, args.max_blocks)
    T = args.tokens_per_block
    summary = {"memory": args.memory, "page_bytes": args.page_bytes, "layers": args.layers,
               "tokens_per_block": T, "slots": args.slots, "max_running": args.max_running}
    if args.memory == "cuda":
        import torch

        summary["torch"] = torch.__version__
        summary["gpu"] = torch.cuda.get_device_name()
        summary["anchor"] = pinned_anchor(torch)

    # Cold pass: computes and saves every block.
    mem = new_memory(args)
    cold = Engine(api, args, args.name + "-cold/rank0", mem)
    summary["registration"] = cold.memory_info
    summary["cold"] = cold.run(reqs)
    cold.close()
    mem.close()

    # Warm pass: a new engine with fresh memory loads what the cold pass saved.
    mem = new_memory(args)
    warm = Engine(api, args, args.name + "-warm/rank0", mem)
    # An engine RPC's own cost on an idle daemon: calls that do next to nothing there.
    t0 = time.perf_counter()
    for _ in range(200):
        api.call("TakeFailedLoads", engine=warm.name)
    summary["idle_rpc_seconds"] = (time.perf_counter() - t0) / 200
    summary["warm"] = warm.run([(rid + "-warm", toks) for rid, toks in reqs])
    # Every full block but the one holding the last prompt token is offered.
    summary["expected_warm_loaded_blocks"] = sum((len(t) - 1) // T for _, t in reqs)
    if args.stats_url:
        with urllib.request.urlopen(args.stats_url, timeout=30) as resp:
            summary["daemon_loads"] = json.load(resp)["loads"]
    warm.close()
    mem.close()
    api.close()

    if args.memory == "cuda":
        # Measured again after the passes: the anchor brackets the loads.
        after = pinned_anchor(torch)
        summary["anchor_after"] = after
    w = summary["warm"]
    problems = []
    if summary["cold"]["mismatched_blocks"] or w["mismatched_blocks"]:
        problems.append("loaded pages held wrong bytes")
    if w["loaded_blocks"] == 0:
        problems.append("the warm pass loaded nothing")
    summary["ok"] = not problems
    summary["problems"] = problems
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
