"""SchedulerRank: a scheduler in another connection (vLLM's engine core, beside its workers)
attaches to a rank's scheduler adapter with the registration's scheduler token, against a real
kvctl serve. The attached handle drives a whole request (lookup, allocation, metadata, finish)
whose pages the registering connection moves; worker calls stay with that connection; a wrong
token, a rank without a scheduler, the registering connection itself and a gone daemon are
refused with the SDK's error classes."""

from __future__ import annotations

import random
import shutil
import uuid

import pytest

import kvctl_engine as kv
from kvctl_engine._pb import engine_pb2 as pb

from .conftest import start_daemon
from .test_lifecycle import LAYERS, PIECE, SLOTS, Pages, T, layout, page_bytes


def _name(tag: str) -> str:
    return "attach-%s-%s" % (tag, uuid.uuid4().hex[:8])


def _run(sched: kv.SchedulerRank, worker: kv.Rank, pages: Pages, rid: str, tokens: list[int]) -> tuple[int, bool]:
    """One request, the scheduler calls over sched and the worker calls over worker; returns
    the tokens restored and whether every loaded block holds the bytes computed for it."""
    hit = sched.lookup(kv.Request(rid, tokens))
    n = -(-len(tokens) // T)
    slots = [pages.free.pop() for _ in range(n)]
    for s in slots:
        pages.poison(s)
    sched.update_state_after_alloc(rid, [slots], hit.matched_tokens)
    rd = kv.RequestData(rid, [slots], 0, len(tokens) - hit.matched_tokens)
    meta = sched.build_meta([rd], [], sched.take_submitted_saves())
    worker.bind_meta(meta)
    worker.start_load()
    assert worker.take_failed_loads() == []
    intact = all(pages.read(slots[b]) == page_bytes(tokens, b) for b in range(hit.matched_tokens // T))
    for b in range(hit.matched_tokens // T, len(tokens) // T):
        pages.write(slots[b], page_bytes(tokens, b))
    saving = sched.request_finished(rid)
    worker.wait_for_save()
    gen = [rid]
    for _ in range(2000):
        if rid in worker.get_finished(gen).finished_saving or not saving:
            break
        gen = []
    else:
        raise AssertionError("the saves of %s did not finish" % rid)
    pages.free.extend(slots)
    return hit.matched_tokens, intact


def test_attached_scheduler_drives_the_rank(daemon) -> None:
    name = _name("drive") + "/rank0"
    rng = random.Random(5)
    tokens = [rng.randrange(50000) for _ in range(5 * T + 3)]
    with kv.connect(daemon.socket) as wc, kv.connect(daemon.socket) as sc:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        worker = kv.Rank.register(wc, name, layout(), shm, model_key="attach-model")
        assert len(worker.scheduler_token) == 64, worker.scheduler_token
        pages = Pages(shm)

        # Before attaching, the scheduler's connection may not name the rank.
        with pytest.raises(kv.NotOwner, match=name):
            sc.call("Lookup", _lookup_pb(name, tokens))
        sched = kv.SchedulerRank.attach(sc, name, worker.scheduler_token)
        assert sched.name == name and sched.shard == worker.shard
        assert sched.declarations == worker.declarations

        cold, _ = _run(sched, worker, pages, "cold", tokens)
        assert cold == 0
        warm, intact = _run(sched, worker, pages, "warm", tokens)
        assert warm == 5 * T and intact
        # Prompts travel packed: the arena is the registering connection's.
        assert sched.via_packed == 2 and sched.via_arena == 0

        # Worker calls and Unregister remain the registering connection's.
        for method in ("StartLoad", "WaitForSave", "Unregister"):
            with pytest.raises(kv.NotOwner, match="attached to its scheduler|over another connection"):
                sc.call(method, pb.EngineRef(engine=name))
        worker.unregister()
        # The attachment went with the rank.
        with pytest.raises(kv.NotRegistered):
            sched.lookup(kv.Request("after", tokens))
        shm.close()


def _lookup_pb(engine: str, tokens: list[int]) -> pb.LookupRequest:
    return pb.LookupRequest(engine=engine, request=pb.Request(id="early", tokens=tokens))


def test_attach_refusals(daemon) -> None:
    base = _name("refuse")
    with kv.connect(daemon.socket) as wc, kv.connect(daemon.socket) as sc:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        r0 = kv.Rank.register(wc, base + "/rank0", layout(), shm, model_key="m", world_size=2, rank=0)
        shm1 = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        r1 = kv.Rank.register(wc, base + "/rank1", layout(), shm1, model_key="m", world_size=2, rank=1, scheduler=False)
        assert r1.scheduler_token == ""
        with pytest.raises(kv.NotOwner, match="wrong scheduler token"):
            kv.SchedulerRank.attach(sc, r0.name, "0" * 64)
        with pytest.raises(kv.FailedPrecondition, match="without the scheduler adapter"):
            kv.SchedulerRank.attach(sc, r1.name, r0.scheduler_token)
        with pytest.raises(kv.NotRegistered, match="nobody"):
            kv.SchedulerRank.attach(sc, "nobody", r0.scheduler_token)
        with pytest.raises(kv.FailedPrecondition, match="drives its scheduler already"):
            kv.SchedulerRank.attach(wc, r0.name, r0.scheduler_token)
        # Caught before any call.
        with pytest.raises(kv.InvalidArgument, match="no scheduler token"):
            kv.SchedulerRank.attach(sc, r0.name, r1.scheduler_token)
        with pytest.raises(kv.InvalidArgument, match="no engine"):
            kv.SchedulerRank.attach(sc, "", r0.scheduler_token)
        # The right token still works after the refusals.
        s = kv.SchedulerRank.attach(sc, r0.name, r0.scheduler_token)
        assert s.lookup(kv.Request("x", list(range(3 * T)))).matched_tokens == 0
        r1.unregister()
        r0.unregister()
        shm.close()
        shm1.close()


def test_attachment_ends_with_its_connection(daemon) -> None:
    name = _name("ends") + "/rank0"
    with kv.connect(daemon.socket) as wc:
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        r = kv.Rank.register(wc, name, layout(), shm, model_key="m")
        sc = kv.connect(daemon.socket)
        s = kv.SchedulerRank.attach(sc, name, r.scheduler_token)
        s.lookup(kv.Request("a", list(range(2 * T))))
        sc.close()
        with pytest.raises(kv.DaemonUnavailable, match="closed"):
            s.lookup(kv.Request("b", list(range(2 * T))))
        # A new connection must attach again.
        with kv.connect(daemon.socket) as again:
            with pytest.raises(kv.NotOwner):
                again.call("Lookup", _lookup_pb(name, list(range(2 * T))))
            kv.SchedulerRank.attach(again, name, r.scheduler_token).lookup(kv.Request("c", list(range(2 * T))))
        r.unregister()
        shm.close()


def test_attach_to_a_daemon_that_went_away(kvctl_bin) -> None:
    d = start_daemon(kvctl_bin)
    try:
        wc = kv.connect(d.socket)
        sc = kv.connect(d.socket, call_channel=False)
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        r = kv.Rank.register(wc, _name("gone") + "/rank0", layout(), shm, model_key="m")
        s = kv.SchedulerRank.attach(sc, r.name, r.scheduler_token)
        d.kill()
        with pytest.raises(kv.DaemonUnavailable):
            s.lookup(kv.Request("x", list(range(2 * T))), timeout=10)
        with pytest.raises(kv.DaemonUnavailable):
            kv.SchedulerRank.attach(sc, r.name, r.scheduler_token, timeout=10)
        wc.close()
        sc.close()
        shm.close()
    finally:
        d.kill()
        shutil.rmtree(d.dir, ignore_errors=True)
