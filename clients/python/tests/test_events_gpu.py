"""Stream ordering on a GPU: an engine that never synchronises its device around StartLoad and
WaitForSave, against a running `kvctl serve`.

Run by core/daemon's TestGPUStreamOrdering (KVCTL_GPU_E2E=1), which starts the daemon and runs

    python test_events_gpu.py --socket PATH --descriptor core/daemon/testdata/engine.pb

It prints one line `SUMMARY {json}`. Four cases, each repeated --repeats times, each with a
fresh prompt; an "ordered" engine registers a CUDA interprocess event (kvctl_engine.cuda_events),
an "unordered" one registers none and, like the ordered one, does not synchronise either, which
is the negative control:

- load: the engine queues a long kernel (torch.cuda._sleep) and behind it a fill of the
  destination pages with 0x5A (work still using the pages), records its event and calls
  StartLoad at once. Ordered, the daemon's copies wait for that work and the engine's stream
  waits on the daemon's event before it reads: every page holds the loaded bytes. Unordered,
  the copies land first and the fill overwrites them.
- save: the engine queues a long kernel and behind it the writes of the pages' final KV (the
  pages hold other, stale bytes before), records its event and calls WaitForSave at once, then
  RequestFinished and GetFinished until the save is reported. Ordered, the pool holds the final
  bytes; unordered, the save reads the stale ones. Whether WaitForSave returned while the
  kernel still ran (no host sync) is recorded too. The pool's copy is read back by loading it
  into fresh pages of the same engine after a synchronisation.

As a pytest module it skips unless KVCTL_EVENTS_SOCKET names a running daemon's socket.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

PKG = "kvctl.engine.v1"
KERNEL_BYTE = 0x5A
STALE_BYTE = 0x11
POISON_BYTE = 0xEE


class API:
    """The Engine service's messages and methods over plain gRPC, from a FileDescriptorSet."""

    def __init__(self, descriptor_path: str, socket_path: str) -> None:
        import grpc
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        self._mf = message_factory
        with open(descriptor_path, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            self.pool.AddSerializedFile(fd.SerializeToString())
        self._classes: dict = {}
        self.channel = grpc.insecure_channel("unix:" + os.path.abspath(socket_path))
        service = self.pool.FindServiceByName(PKG + ".Engine")
        self._methods = {}
        self._inputs = {}
        for m in service.methods:
            self._methods[m.name] = self.channel.unary_unary(
                f"/{PKG}.Engine/{m.name}",
                request_serializer=lambda msg: msg.SerializeToString(),
                response_deserializer=self.cls(m.output_type.full_name).FromString,
            )
            self._inputs[m.name] = m.input_type.full_name

    def cls(self, name: str):
        if "." not in name:
            name = PKG + "." + name
        c = self._classes.get(name)
        if c is None:
            d = self.pool.FindMessageTypeByName(name)
            if hasattr(self._mf, "GetMessageClass"):
                c = self._mf.GetMessageClass(d)
            else:
                c = self._mf.MessageFactory(self.pool).GetPrototype(d)
            self._classes[name] = c
        return c

    def msg(self, name: str, **kw):
        return self.cls(name)(**kw)

    def call(self, method: str, timeout: float = 120, **kw):
        return self._methods[method](self.cls(self._inputs[method])(**kw), timeout=timeout)


def prompt(seed: int, n: int) -> list[int]:
    out = []
    for i in range(n):
        d = hashlib.blake2b(f"{seed}/{i}".encode(), digest_size=4).digest()
        out.append(int.from_bytes(d, "little") % 32000)
    return out


class Engine:
    """One engine rank (world size 1, scheduler adapter on) with its KV pool in one CUDA tensor:
    one layer group, page slot s is bytes [s*page, (s+1)*page)."""

    def __init__(
        self,
        api: API,
        torch,
        name: str,
        ordered: bool,
        slots: int,
        page_bytes: int,
        T: int,
    ) -> None:
        from kvctl_engine.cuda_events import TorchStreamOrder

        self.api, self.torch, self.name, self.ordered = api, torch, name, ordered
        self.T, self.page_bytes, self.slots = T, page_bytes, slots
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.mem = torch.full((slots * page_bytes,), POISON_BYTE, dtype=torch.uint8, device=self.dev)
        torch.cuda.synchronize()
        self.free = list(range(slots))
        shared = self.mem.untyped_storage()._share_cuda_()
        handle, offset = shared[1], shared[3]
        layout = api.msg(
            "Layout",
            tokens_per_block=T,
            groups=[
                api.msg(
                    "LayerGroup",
                    id=0,
                    slots=slots,
                    regions=[api.msg("Region", offset=0, stride=page_bytes, size=page_bytes)],
                )
            ],
        )
        kw = {}
        self.order = None
        if ordered:
            self.order = TorchStreamOrder(self.dev.index)
            kw["engine_event"] = api.msg("CudaEvent", **self.order.register_fields())
        resp = api.call(
            "Register",
            engine=name,
            model_key="stream-ordering",
            world_size=1,
            rank=0,
            role="both",
            scheduler=True,
            layout=layout,
            cuda_ipc=api.msg(
                "CudaIPC",
                handle=handle,
                offset=offset,
                size=slots * page_bytes,
                device=self.dev.index,
            ),
            **kw,
        )
        self.daemon_event_bytes = len(resp.daemon_event.handle) if resp.HasField("daemon_event") else 0
        if ordered:
            self.order.open_daemon_event(resp.daemon_event.handle)

    def page(self, slot: int):
        return self.mem[slot * self.page_bytes : (slot + 1) * self.page_bytes]

    def value(self, seed: int):
        t = self.torch
        x = t.arange(self.page_bytes // 8, dtype=t.int64, device=self.dev)
        x = (x + seed) * 6364136223846793005
        x = x ^ (x >> 29)
        return x.view(t.uint8)

    def alloc(self, n: int) -> list[int]:
        if len(self.free) < n:
            raise RuntimeError(f"{n} slots needed, {len(self.free)} free")
        out, self.free = self.free[:n], self.free[n:]
        return out

    def record(self) -> None:
        if self.order is not None:
            self.order.record()

    def after_start_load(self) -> None:
        if self.order is not None:
            self.order.wait_daemon()

    def admit(self, rid: str, tokens: list[int], want_matched: int) -> tuple[list[int], int]:
        """Lookup, allocation report, metadata and BindMeta for one new request."""
        api, name = self.api, self.name
        lr = api.call(
            "Lookup",
            engine=name,
            num_computed_tokens=0,
            request=api.msg("Request", id=rid, tokens=tokens, context_only=True),
        )
        if lr.matched_tokens != want_matched:
            raise RuntimeError(f"{rid}: lookup matched {lr.matched_tokens} tokens, want {want_matched}")
        pages = self.alloc((len(tokens) + self.T - 1) // self.T)
        ids = [api.msg("BlockIDs", ids=pages)]
        api.call(
            "UpdateStateAfterAlloc",
            engine=name,
            request_id=rid,
            block_ids_by_group=ids,
            honoured_tokens=lr.matched_tokens,
        )
        subs = api.call("TakeSubmittedSaves", engine=name)
        rd = api.msg(
            "RequestData",
            id=rid,
            computed_position=0,
            num_scheduled_tokens=len(tokens) - lr.matched_tokens,
            new_block_ids_by_group=ids,
        )
        meta = api.call("BuildMeta", engine=name, new_requests=[rd], submitted_saves=list(subs.ids))
        api.call("BindMeta", engine=name, metadata=meta)
        return pages, lr.matched_tokens

    def finish(self, rid: str, pages: list[int], timeout: float = 60) -> bool:
        """RequestFinished, then GetFinished until the request's saves are reported."""
        api, name = self.api, self.name
        fr = api.call("RequestFinished", engine=name, request_id=rid)
        gen = [rid] if fr.async_saving else []
        deadline = time.monotonic() + timeout
        while fr.async_saving:
            gf = api.call("GetFinished", engine=name, finished_gen=gen)
            gen = []
            if rid in gf.finished_saving:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{rid}: saves not reported within {timeout}s")
            time.sleep(0.002)
        self.free.extend(pages)
        return fr.async_saving

    def load_back(self, rid: str, tokens: list[int], blocks: int) -> list[int]:
        """Loads a saved prefix into fresh pages, with the device synchronised around StartLoad
        (outside any test window), and returns its pages."""
        pages, _ = self.admit(rid, tokens, blocks * self.T)
        self.torch.cuda.synchronize()
        self.record()
        self.api.call("StartLoad", engine=self.name)
        self.after_start_load()
        self.api.call("TakeFailedLoads", engine=self.name)
        self.torch.cuda.synchronize()
        return pages

    def classify(self, pages: list[int], seeds: list[int], other_byte: int) -> dict:
        """Counts the pages holding the expected bytes, those holding only other_byte, and the
        rest. The comparisons are queued on the current stream, after any wait on it."""
        t = self.torch
        res = {"expected": 0, "other": 0, "mixed": 0}
        for slot, seed in zip(pages, seeds, strict=True):
            p = self.page(slot)
            if t.equal(p, self.value(seed)):
                res["expected"] += 1
            elif bool((p == other_byte).all().item()):
                res["other"] += 1
            else:
                res["mixed"] += 1
        return res

    def close(self) -> None:
        self.api.call("Unregister", engine=self.name, timeout=120)


def sleep_cycles(torch, ms: float) -> int:
    """Cycles of torch.cuda._sleep that take about ms on this GPU (measured)."""
    probe = 20_000_000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # warm-up
    a.record()
    torch.cuda._sleep(probe)
    b.record()
    torch.cuda.synchronize()
    per_ms = probe / max(a.elapsed_time(b), 1e-3)
    return int(per_ms * ms)


def save_case(eng: Engine, seed: int, blocks: int, cycles: int, marker) -> dict:
    t, T = eng.torch, eng.T
    tokens = prompt(seed, blocks * T + 1)
    rid = f"save-{seed}"
    pages, _ = eng.admit(rid, tokens, 0)
    eng.api.call("StartLoad", engine=eng.name)
    eng.api.call("TakeFailedLoads", engine=eng.name)
    seeds = [seed * 1000 + b for b in range(blocks)]
    for slot in pages:
        eng.page(slot).fill_(STALE_BYTE)
    t.cuda.synchronize()  # the test window starts with stale bytes in every page
    # The forward pass: a long kernel, then the kernels writing the final KV; nothing waits.
    t.cuda._sleep(cycles)
    for b in range(blocks):
        eng.page(pages[b]).copy_(eng.value(seeds[b]))
    marker.record()
    eng.record()
    began = time.perf_counter()
    eng.api.call("WaitForSave", engine=eng.name)
    returned = time.perf_counter() - began
    running_after_call = not marker.query()
    saved = eng.finish(rid, pages)
    t.cuda.synchronize()  # the test window ends
    back = eng.load_back(rid + "-back", tokens, blocks)
    res = eng.classify(back[:blocks], seeds, STALE_BYTE)
    eng.finish(rid + "-back", back)
    res.update(
        saved=saved,
        kernel_running_when_wait_for_save_returned=running_after_call,
        wait_for_save_seconds=returned,
    )
    return res


def load_case(eng: Engine, seed: int, blocks: int, cycles: int, marker) -> dict:
    t, T = eng.torch, eng.T
    tokens = prompt(seed, blocks * T + 1)
    seeds = [seed * 1000 + b for b in range(blocks)]
    # The prefix, computed and saved with the device synchronised (outside the test window).
    rid = f"cold-{seed}"
    pages, _ = eng.admit(rid, tokens, 0)
    eng.api.call("StartLoad", engine=eng.name)
    eng.api.call("TakeFailedLoads", engine=eng.name)
    for b in range(blocks):
        eng.page(pages[b]).copy_(eng.value(seeds[b]))
    t.cuda.synchronize()
    eng.record()
    eng.api.call("WaitForSave", engine=eng.name)
    eng.finish(rid, pages)

    rid = f"load-{seed}"
    pages, matched = eng.admit(rid, tokens, blocks * T)
    t.cuda.synchronize()  # the test window starts: pages poisoned, nothing running
    # Work still using the destination pages: a long kernel, then a fill of them.
    t.cuda._sleep(cycles)
    for b in range(blocks):
        eng.page(pages[b]).fill_(KERNEL_BYTE)
    marker.record()
    eng.record()
    began = time.perf_counter()
    eng.api.call("StartLoad", engine=eng.name)
    took = time.perf_counter() - began
    running_after_call = not marker.query()
    eng.api.call("TakeFailedLoads", engine=eng.name)
    eng.after_start_load()
    res = eng.classify(pages[:blocks], seeds, KERNEL_BYTE)
    t.cuda.synchronize()  # the test window ends
    eng.finish(rid, pages)
    res.update(
        matched_tokens=matched,
        start_load_seconds=took,
        kernel_running_when_start_load_returned=running_after_call,
    )
    return res


def bench_loads(eng: Engine, seed: int, blocks: int, n: int) -> dict:
    """StartLoad's time with nothing running on the GPU, n loads of one saved prefix: what the
    event path costs (the fence capture, the streams' waits and the daemon's record) against
    an engine that registered no event."""
    t, T = eng.torch, eng.T
    tokens = prompt(seed, blocks * T + 1)
    rid = f"bench-cold-{seed}"
    pages, _ = eng.admit(rid, tokens, 0)
    eng.api.call("StartLoad", engine=eng.name)
    eng.api.call("TakeFailedLoads", engine=eng.name)
    for b in range(blocks):
        eng.page(pages[b]).copy_(eng.value(seed * 1000 + b))
    t.cuda.synchronize()
    eng.record()
    eng.api.call("WaitForSave", engine=eng.name)
    eng.finish(rid, pages)
    times = []
    for i in range(n):
        rid = f"bench-{seed}-{i}"
        pages, _ = eng.admit(rid, tokens, blocks * T)
        t.cuda.synchronize()
        eng.record()
        began = time.perf_counter()
        eng.api.call("StartLoad", engine=eng.name)
        times.append(time.perf_counter() - began)
        eng.after_start_load()
        eng.api.call("TakeFailedLoads", engine=eng.name)
        t.cuda.synchronize()
        eng.finish(rid, pages)
    times.sort()
    return {
        "loads": n,
        "median_seconds": times[n // 2],
        "mean_seconds": sum(times) / n,
        "min_seconds": times[0],
    }


def run(args) -> dict:
    import torch

    api = API(args.descriptor, args.socket)
    cycles = sleep_cycles(torch, args.sleep_ms)
    engines = {
        "ordered": Engine(
            api,
            torch,
            "ordered",
            True,
            args.slots,
            args.page_bytes,
            args.tokens_per_block,
        ),
        "unordered": Engine(
            api,
            torch,
            "unordered",
            False,
            args.slots,
            args.page_bytes,
            args.tokens_per_block,
        ),
    }
    marker = torch.cuda.Event()
    out = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sleep_ms": args.sleep_ms,
        "sleep_cycles": cycles,
        "blocks": args.blocks,
        "page_bytes": args.page_bytes,
        "daemon_event_bytes": engines["ordered"].daemon_event_bytes,
        "unordered_daemon_event_bytes": engines["unordered"].daemon_event_bytes,
        "event_handle_bytes": len(engines["ordered"].order.handle()),
        "cases": {},
    }
    seed = args.seed
    for r in range(args.repeats):
        for kind, case in (("load", load_case), ("save", save_case)):
            for which, eng in engines.items():
                seed += 1
                res = case(eng, seed, args.blocks, cycles, marker)
                out["cases"].setdefault(f"{kind}/{which}", []).append(res)
                print(f"repeat {r} {kind}/{which}: {json.dumps(res)}", file=sys.stderr)
    if args.bench_loads > 0:
        out["bench_start_load"] = {}
        for r in range(2):  # interleaved, twice, so neither engine always goes first
            for which, eng in engines.items():
                seed += 1
                res = bench_loads(eng, seed, args.blocks, args.bench_loads)
                out["bench_start_load"].setdefault(which, []).append(res)
                print(f"bench {r} {which}: {json.dumps(res)}", file=sys.stderr)
    for eng in engines.values():
        eng.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", required=True)
    p.add_argument(
        "--descriptor",
        default=os.path.join(REPO, "core", "daemon", "testdata", "engine.pb"),
    )
    p.add_argument("--page-bytes", type=int, default=1 << 20)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--tokens-per-block", type=int, default=16)
    p.add_argument("--sleep-ms", type=float, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument(
        "--bench-loads",
        type=int,
        default=50,
        help="StartLoads timed per engine with the GPU idle (0: none)",
    )
    args = p.parse_args(argv)
    out = run(args)
    print("SUMMARY " + json.dumps(out), flush=True)
    return 0


def test_stream_ordering_on_gpu():
    """pytest entry: needs KVCTL_EVENTS_SOCKET (a running daemon with a GPU device backend)."""
    import pytest

    sock = os.environ.get("KVCTL_EVENTS_SOCKET")
    if not sock:
        pytest.skip("set KVCTL_EVENTS_SOCKET to a kvctl serve socket on a GPU host")
    out = run(
        argparse.Namespace(
            socket=sock,
            descriptor=os.path.join(REPO, "core", "daemon", "testdata", "engine.pb"),
            page_bytes=1 << 20,
            blocks=8,
            slots=64,
            tokens_per_block=16,
            sleep_ms=300,
            repeats=2,
            seed=5000,
            bench_loads=0,
        )
    )
    for res in out["cases"]["load/ordered"] + out["cases"]["save/ordered"]:
        assert res["expected"] == 8, res


if __name__ == "__main__":
    sys.exit(main())
