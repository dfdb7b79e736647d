"""The whole request lifecycle through the SDK against a real kvctl serve, over gRPC and over a
call channel: a cold engine computes and saves every block, a warm engine with fresh memory
loads them, and every loaded page must hold the bytes the cold engine wrote."""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field

import pytest

import kvctl_engine as kv

T = 16  # tokens per block
LAYERS = 2
PIECE = 2048  # bytes of one layer's region of a page
SLOTS = 96


def layout() -> kv.Layout:
    regions = [kv.Region(offset=layer * SLOTS * PIECE, stride=PIECE, size=PIECE) for layer in range(LAYERS)]
    return kv.Layout(tokens_per_block=T, groups=[kv.LayerGroup(id=0, slots=SLOTS, regions=regions)])


def page_bytes(tokens: list[int], block: int) -> bytes:
    """The KV the engine 'computes' for a block: a function of the prefix it ends."""
    seed = hashlib.blake2b(kv.pack_tokens(tokens[: (block + 1) * T]), digest_size=16).digest()
    return hashlib.shake_256(seed).digest(LAYERS * PIECE)


class Pages:
    """The engine's KV pool in a SharedMemory with the layout above."""

    def __init__(self, shm: kv.SharedMemory) -> None:
        self.buf = shm.buf
        self.free = list(range(SLOTS - 1, -1, -1))

    def write(self, slot: int, data: bytes) -> None:
        for layer in range(LAYERS):
            off = (layer * SLOTS + slot) * PIECE
            self.buf[off : off + PIECE] = data[layer * PIECE : (layer + 1) * PIECE]

    def read(self, slot: int) -> bytes:
        return b"".join(self.buf[(layer * SLOTS + slot) * PIECE :][:PIECE] for layer in range(LAYERS))

    def poison(self, slot: int) -> None:
        self.write(slot, b"\xee" * (LAYERS * PIECE))


@dataclass
class Req:
    id: str
    tokens: list[int]
    pages: list[int] = field(default_factory=list)
    computed: int = 0
    restore: int = 0
    sent: bool = False
    phase: str = "waiting"


@dataclass
class Result:
    matched_tokens: int = 0
    loaded_blocks: int = 0
    computed_blocks: int = 0
    mismatched_blocks: int = 0
    restarts: int = 0
    steps: int = 0
    load_pages: int = 0
    save_pages: int = 0
    early_loads: list[str] = field(default_factory=list)


def run(rank: kv.Rank, shm: kv.SharedMemory, reqs: list[Req], chunk_blocks: int = 3) -> Result:
    """Runs reqs to the end, step by step in connector.Driver's order (docs/ENGINE_API.md)."""
    pages = Pages(shm)
    res = Result()
    by_id = {r.id: r for r in reqs}
    step = 0
    for step in range(2000):  # noqa: B007 - named in the failure below
        if all(r.phase == "done" for r in reqs):
            break
        res.steps += 1
        # Admission: Lookup, allocate, UpdateStateAfterAlloc.
        for r in reqs:
            if r.phase != "waiting":
                continue
            hit = rank.lookup(kv.Request(r.id, r.tokens, context_only=True))
            assert hit.matched_tokens % T == 0 and not hit.is_async
            n = -(-len(r.tokens) // T)
            r.pages = [pages.free.pop() for _ in range(n)]
            for p in r.pages:
                pages.poison(p)
            rank.update_state_after_alloc(r.id, [r.pages], hit.matched_tokens)
            r.restore, r.phase, r.sent = hit.matched_tokens, "running", False
            res.matched_tokens += hit.matched_tokens
        # The step's metadata.
        new, cached, scheduled = [], [], {}
        for r in reqs:
            if r.phase != "running":
                continue
            n = min(chunk_blocks * T, len(r.tokens) - r.computed - r.restore)
            rd = kv.RequestData(r.id, [r.pages] if not r.sent else [[]], r.computed, n)
            (cached if r.sent else new).append(rd)
            r.sent = True
            scheduled[r.id] = n
        meta = rank.build_meta(new, cached, rank.take_submitted_saves())
        loads, saves, _ = meta.page_count()
        res.load_pages += loads
        res.save_pages += saves
        res.early_loads += meta.early_loads
        # Worker: BindMeta, StartLoad, TakeFailedLoads.
        rank.bind_meta(meta)
        rank.start_load()
        for rid in rank.take_failed_loads():
            r = by_id[rid]
            rank.request_reset(rid)
            pages.free.extend(r.pages)
            r.pages, r.computed, r.restore, r.phase = [], 0, 0, "waiting"
            scheduled.pop(rid, None)
            res.restarts += 1
        # Compute: check restored blocks, write computed ones; finish prompts.
        finished_gen = []
        for rid, n in scheduled.items():
            r = by_id[rid]
            for b in range(r.computed // T, (r.computed + r.restore) // T):
                res.loaded_blocks += 1
                if pages.read(r.pages[b]) != page_bytes(r.tokens, b):
                    res.mismatched_blocks += 1
            first = (r.computed + r.restore) // T
            r.computed += r.restore + n
            r.restore = 0
            for b in range(first, r.computed // T):
                pages.write(r.pages[b], page_bytes(r.tokens, b))
                res.computed_blocks += 1
            if r.computed == len(r.tokens):
                if rank.request_finished(r.id):
                    r.phase = "saving"
                    finished_gen.append(r.id)
                else:
                    r.phase = "done"
                    pages.free.extend(r.pages)
        # Saves and completions.
        rank.wait_for_save()
        fin = rank.get_finished(finished_gen)
        assert rank.take_failed_async_loads() == []
        for rid in fin.finished_saving:
            r = by_id[rid]
            r.phase = "done"
            pages.free.extend(r.pages)
    else:
        raise AssertionError("requests did not finish within %d steps" % step)
    return res


def prompts(seed: int, n: int) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        toks = [rng.randrange(150000) for _ in range(rng.randint(3, 8) * T + rng.randint(1, T - 1))]
        out.append(("req-%d" % i, toks))
    return out


@pytest.mark.parametrize("transport", ["channel", "grpc"])
def test_cold_then_warm_loads_the_saved_bytes(daemon, transport: str) -> None:
    with kv.connect(daemon.socket, call_channel=transport == "channel") as client:
        ps = prompts(hash(transport) & 0xFFFF, 8)
        cold_shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        cold = kv.Rank.register(
            client, "life-%s-cold/rank0" % transport, layout(), cold_shm, model_key="life-" + transport
        )
        assert cold.daemon_api_version[0] == kv.API_VERSION[0]
        assert cold.declarations.get("reports_failed_loads") is True
        c = run(cold, cold_shm, [Req(i, t) for i, t in ps])
        assert c.matched_tokens == 0 and c.loaded_blocks == 0
        assert c.computed_blocks == sum(len(t) // T for _, t in ps)
        assert c.save_pages > 0
        cold.unregister()

        warm_shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        warm = kv.Rank.register(
            client, "life-%s-warm/rank0" % transport, layout(), warm_shm, model_key="life-" + transport
        )
        w = run(warm, warm_shm, [Req(i + "-warm", t) for i, t in ps])
        # Every full block but the one holding the last prompt token is offered.
        want = sum((len(t) - 1) // T for _, t in ps)
        assert w.loaded_blocks == want
        assert w.load_pages == want
        assert w.mismatched_blocks == 0
        assert w.restarts == 0
        # Lookups wrote their prompts into the prompt arena.
        assert warm.via_arena == len(ps) and warm.via_packed == 0
        warm.unregister()
        chan = client.call_channel
        if transport == "channel":
            assert chan is not None and chan.stats.calls > 0
        else:
            assert chan is None


def test_every_rank_call(daemon) -> None:
    """The calls the lifecycle above does not make, each with its typed result."""
    with kv.connect(daemon.socket) as client:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        rank = kv.Rank.register(client, "calls/rank0", layout(), shm, model_key="calls")
        toks = list(range(5 * T + 3))
        q = rank.admission_query(kv.Request("q", toks))
        assert q == kv.LookupResult(0, False)
        rank.lookup(kv.Request("q", toks))
        rank.cancel_load("q", 0, 0)
        rank.update_state_after_alloc("q", [[0, 1, 2, 3, 4, 5]], 0)
        rank.request_reset("q")
        rank.drop_bound_saves([])
        assert rank.take_submitted_saves() == []
        assert rank.take_failed_async_loads() == []
        assert rank.get_finished() == kv.Finished([], [])
        # Nothing in flight: a waiting call answers at once, with nothing.
        began = time.monotonic()
        assert rank.get_finished(wait=kv.MAX_FINISHED_WAIT) == kv.Finished([], [])
        assert time.monotonic() - began < kv.MAX_FINISHED_WAIT
        with pytest.raises(ValueError, match="wait 1.5 s is outside"):
            rank.get_finished(wait=1.5)
        with pytest.raises(ValueError, match="timeout 0.5 s must be longer than wait 1.0 s"):
            rank.get_finished(wait=1.0, timeout=0.5)
        meta = rank.build_meta()
        assert meta.loads == [] and meta.saves == [] and meta.async_loads == []
        rank.bind_meta(meta)
        rank.start_load()
        rank.wait_for_save()
        rank.unregister()
        with pytest.raises(kv.NotRegistered, match="calls/rank0"):
            rank.take_failed_loads()


def test_packed_prompts_without_an_arena(daemon) -> None:
    with kv.connect(daemon.socket) as client:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        rank = kv.Rank.register(
            client, "packed/rank0", layout(), shm, model_key="packed", options=kv.RankOptions(prompt_arena=False)
        )
        ps = prompts(3, 3)
        run(rank, shm, [Req(i, t) for i, t in ps])
        assert rank.via_arena == 0 and rank.via_packed == 3
        rank.unregister()


def test_32k_token_lookup_agrees_over_both_transports(daemon) -> None:
    """A 32k-token prompt (256 KiB packed, several frames over a channel) whose first blocks are
    saved: packed over gRPC, packed over the channel and through the arena all match the same."""
    with kv.connect(daemon.socket) as client:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        ps = prompts(7, 1)
        saver = kv.Rank.register(client, "big-save/rank0", layout(), shm, model_key="big")
        run(saver, shm, [Req(i, t) for i, t in ps])
        saver.unregister()
        rng = random.Random(9)
        toks = ps[0][1][: (len(ps[0][1]) // T) * T] + [rng.randrange(150000) for _ in range(32 << 10)]
        toks = toks[: 32 << 10]
        rank = kv.Rank.register(client, "big/rank0", layout(), kv.SharedMemory(LAYERS * SLOTS * PIECE), model_key="big")
        from kvctl_engine._pb import engine_pb2 as pb

        answers = {}
        for via in ("grpc", "channel"):
            req = pb.LookupRequest(
                engine=rank.name, request=pb.Request(id="big-" + via, tokens_packed=kv.pack_tokens(toks))
            )
            answers[via] = client.call("AdmissionQuery", req, via=via).matched_tokens
        answers["arena"] = rank.admission_query(kv.Request("big-arena", toks)).matched_tokens
        assert set(answers.values()) == {(len(ps[0][1]) // T) * T}, answers
        stats = client.call_channel.stats
        assert stats.multi_frame_requests >= 1
        rank.unregister()


def test_errors_read_the_same_over_both_transports(daemon) -> None:
    from kvctl_engine._pb import engine_pb2 as pb

    with kv.connect(daemon.socket) as client:
        got = {}
        for via in ("grpc", "channel"):
            with pytest.raises(kv.NotRegistered) as e:
                client.call("TakeFailedLoads", pb.EngineRef(engine="never-registered/rank0"), via=via)
            got[via] = (e.value.code, e.value.details)
        assert got["grpc"] == got["channel"]
        assert "never-registered/rank0" in got["grpc"][1]


def test_a_rank_belongs_to_its_connection(daemon) -> None:
    from kvctl_engine._pb import engine_pb2 as pb

    with kv.connect(daemon.socket) as a, kv.connect(daemon.socket) as b:
        rank = kv.Rank.register(a, "owned/rank0", layout(), kv.SharedMemory(LAYERS * SLOTS * PIECE), model_key="o")
        with pytest.raises(kv.NotOwner, match="another connection"):
            b.call("TakeFailedLoads", pb.EngineRef(engine=rank.name))
        with pytest.raises(kv.AlreadyRegistered, match="owned/rank0"):
            kv.Rank.register(b, "owned/rank0", layout(), kv.SharedMemory(LAYERS * SLOTS * PIECE), model_key="o")
        rank.unregister()


def test_dummy_flag_leaves_the_real_request_alone(daemon):
    """A reset marked dummy (a padding request that carries a real request's id) is skipped:
    the real request keeps its state, so a shorter prompt under its id must restart; the same
    reset without the flag forgets it."""
    with kv.connect(daemon.socket) as client:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        rank = kv.Rank.register(client, "dummy/rank0", layout(), shm, model_key="dummy")
        toks = list(range(4 * T))
        rank.lookup(kv.Request("r", toks))
        rank.update_state_after_alloc("r", [[0, 1, 2, 3]], 0, dummy=True)
        rank.request_finished("r", dummy=True)
        rank.request_reset("r", dummy=True)
        with pytest.raises(kv.RequestMustRestart):
            rank.lookup(kv.Request("r", toks[: 2 * T]))
        rank.request_reset("r")
        assert rank.lookup(kv.Request("r", toks[: 2 * T])).matched_tokens == 0
        rank.unregister()
        shm.close()


@pytest.mark.parametrize("drafter,ok", [("mtp", True), ("eagle3", True), ("eagle3-two-model", False), ("ngram", False)])
def test_register_carries_the_drafter_kind(daemon, drafter, ok):
    """Speculative prefill is accepted with a one-model MTP or EAGLE3 drafter only, as
    TensorRT-LLM's allow-list says; the refusal names the drafter."""
    with kv.connect(daemon.socket) as client:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        opts = kv.RankOptions(speculative_prefill=True, prompt_lookahead=1, drafter=drafter)
        name = "drafter-%s/rank0" % drafter
        if ok:
            kv.Rank.register(client, name, layout(), shm, model_key="drafter", options=opts).unregister()
        else:
            with pytest.raises(kv.InvalidArgument, match=drafter):
                kv.Rank.register(client, name, layout(), shm, model_key="drafter", options=opts)
        shm.close()


def test_early_loads_load_the_saved_bytes(daemon) -> None:
    """With early_loads (API 1.4) a hit's load starts at update_state_after_alloc: the step's
    metadata names the request in early_loads and carries no transfer for it, start_load waits
    for it, and every loaded page holds the bytes the cold engine wrote."""
    with kv.connect(daemon.socket) as client:
        ps = prompts(0xEA71, 8)
        cold_shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        cold = kv.Rank.register(client, "early-cold/rank0", layout(), cold_shm, model_key="early")
        run(cold, cold_shm, [Req(i, t) for i, t in ps])
        cold.unregister()

        warm_shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        warm = kv.Rank.register(
            client, "early-warm/rank0", layout(), warm_shm, model_key="early", options=kv.RankOptions(early_loads=True)
        )
        reqs = [Req(i + "-warm", t) for i, t in ps]
        w = run(warm, warm_shm, reqs)
        assert w.loaded_blocks == sum((len(t) - 1) // T for _, t in ps)
        assert w.mismatched_blocks == 0 and w.restarts == 0
        assert w.load_pages == 0
        assert sorted(w.early_loads) == sorted(r.id for r in reqs)
        warm.unregister()

        # Where the allocation report cannot start every rank's load, registration refuses it.
        with pytest.raises(kv.errors.InvalidArgument, match="early_loads: needs a single rank"):
            kv.Rank.register(
                client,
                "early-tp/rank0",
                layout(),
                kv.SharedMemory(LAYERS * SLOTS * PIECE),
                model_key="early",
                world_size=2,
                options=kv.RankOptions(early_loads=True),
            )
