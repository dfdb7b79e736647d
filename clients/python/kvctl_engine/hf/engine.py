"""The reference engine: one rank (or a tensor-parallel group of ranks) serving prompts one at a
time over kvctl serve, in the call order of connector.Driver (docs/ENGINE_API.md).

Per prompt:

1. Lookup (scheduler rank) of the whole prompt, nothing computed locally.
2. Pages for every block of the prompt, and UpdateStateAfterAlloc honouring the whole hit.
3. TakeSubmittedSaves (every rank), BuildMeta (scheduler rank) with the request as new and the
   rest of the prompt scheduled; the metadata goes to every rank.
4. BindMeta, StartLoad, TakeFailedLoads (every rank). A request handed back is RequestReset, its
   pages released, and it starts again at 1 (restarts counts them). A page removed from the pool
   shortens the next lookup's hit; a page the pool refuses (it fails its checksum) is offered
   again, so an offer as long as the one that failed is turned down (honoured 0) and the prompt
   computed.
5. A transformers cache is built from the loaded pages (the hit prefix), the rest of the prompt
   is computed block by block, and every block computed is written into its page.
6. RequestFinished (scheduler rank), WaitForSave (every rank): the computed full blocks go to
   the pool. The first token is taken here (time to first token ends).
7. Greedy decoding; then GetFinished on every rank until each reports the request's saves done,
   and the pages are released.

Without a socket (``--no-cache``) steps 1-4 and 6-7's calls are skipped and everything is
computed, in the same block-sized chunks, so that the two runs can be compared bit for bit.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from . import model as M
from .pages import KVPool


class Group:
    """The tensor-parallel group's collectives; a single rank is a group of one."""

    world_size = 1
    rank = 0

    def broadcast(self, obj: Any) -> Any:
        """obj from rank 0, on every rank."""
        return obj

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order, on every rank."""
        return [obj]

    def all_reduce(self, t: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass


class TorchGroup(Group):
    """A group over torch.distributed (gloo): ranks are separate processes that meet at
    init_method (e.g. tcp://127.0.0.1:PORT)."""

    def __init__(self, init_method: str, world_size: int, rank: int, timeout_s: float = 120) -> None:
        import datetime

        import torch.distributed as dist

        self.dist = dist
        self.world_size, self.rank = world_size, rank
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def broadcast(self, obj: Any) -> Any:
        box = [obj if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def all_reduce(self, t: torch.Tensor) -> None:
        if t.device.type == "cpu":
            self.dist.all_reduce(t)
        else:  # gloo reduces host tensors
            h = t.cpu()
            self.dist.all_reduce(h)
            t.copy_(h)

    def close(self) -> None:
        self.dist.destroy_process_group()


@dataclasses.dataclass
class EngineOptions:
    spec: M.ModelSpec = dataclasses.field(default_factory=M.ModelSpec)
    device: str = "cpu"
    tokens_per_block: int = 16
    # Prefill chunk in tokens, a multiple of tokens_per_block (0: one block). Runs compared bit
    # for bit must use the same chunk.
    chunk_tokens: int = 0
    slots: int = 256
    use_cache: bool = True  # False: no kvctl, every token computed (--no-cache)
    socket: str | None = None  # None: kvctl_engine's default socket ($KVCTL_SOCKET, then serve's default)
    name: str = ""  # the registered engine name (default kvctl-hf-PID/rankR)
    namespace: str = ""
    model_key: str = ""  # default: spec.model_key()
    save_timeout_s: float = 120.0
    staging_buffer_bytes: int = 0
    # On CUDA, order the daemon's copies and this engine's kernels with interprocess events
    # (kvctl_engine.cuda_events) instead of synchronising the device around each call.
    stream_order: bool = True


@dataclasses.dataclass
class Result:
    """One prompt's outcome. JSON fields (to_json) are a contract: add, never rename."""

    tokens: list[int]
    loaded_tokens: int
    computed_tokens: int
    ttft_seconds: float
    prompt_tokens: int
    restarts: int = 0
    saved_blocks: int = 0
    load_seconds: float = 0.0
    logits: list[torch.Tensor] = dataclasses.field(default_factory=list, repr=False)
    pages: dict[int, bytes] = dataclasses.field(default_factory=dict, repr=False)  # block -> page bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "loaded_tokens": self.loaded_tokens,
            "computed_tokens": self.computed_tokens,
            "ttft_seconds": self.ttft_seconds,
            "prompt_tokens": self.prompt_tokens,
            "restarts": self.restarts,
            "saved_blocks": self.saved_blocks,
            "load_seconds": self.load_seconds,
        }


@dataclasses.dataclass
class Hooks:
    """Test and operator hooks, all optional.

    before_load(request_id, matched_tokens) runs after the allocation report and before
    StartLoad (e.g. to remove a page from the pool); after_load(pool, slots) runs on the loaded
    pages before they are used (the negative control alters one); keep_pages asks for every
    full block's page bytes in Result.pages."""

    before_load: Callable[[str, int], None] | None = None
    after_load: Callable[[KVPool, list[int]], None] | None = None
    keep_pages: bool = False


class SaveTimeout(RuntimeError):
    pass


class Engine:
    """A model and, with a socket, a registered kvctl rank with its KV pool."""

    _ids = itertools.count()

    def __init__(self, opts: EngineOptions, group: Group | None = None) -> None:
        self.opts = opts
        self.group = group or Group()
        self.spec = opts.spec
        self.spec.validate()
        T = opts.tokens_per_block
        if T < 1:
            raise ValueError("tokens per block %d: must be positive" % T)
        self.chunk = opts.chunk_tokens or T
        if self.chunk % T:
            raise ValueError("prefill chunk %d: must be a multiple of the block size %d" % (self.chunk, T))
        self.device = torch.device(opts.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.model = M.build_model(self.spec, self.device)
        g = self.group
        self.tp = M.TensorParallel(g.world_size, g.rank, g.all_reduce)
        M.shard_model(self.model, self.spec, self.tp)
        self.kv_heads = len(self.tp.kv_heads(self.spec))
        self.pool: KVPool | None = None
        self.rank: Any = None
        self.client: Any = None
        if opts.use_cache:
            self._register()

    @property
    def scheduler(self) -> bool:
        return self.group.rank == 0

    def _register(self) -> None:
        import kvctl_engine as kv
        from kvctl_engine import cuda as kcuda

        o = self.opts
        self.pool = KVPool(
            self.spec.layers,
            o.slots,
            self.kv_heads,
            o.tokens_per_block,
            self.spec.head_dim,
            self.spec.torch_dtype,
            self.device,
        )
        lay = self.pool.layout()
        layout = kv.Layout(
            lay.tokens_per_block,
            [
                kv.LayerGroup(g.id, g.slots, [kv.Region(r.offset, r.stride, r.size) for r in g.regions])
                for g in lay.groups
            ],
        )
        if self.pool.shm is not None:
            memory: Any = self.pool.shm
        else:
            memory = kcuda.ipc_handle_from_tensor(self.pool.raw)
        name = o.name or "kvctl-hf-%d" % os.getpid()
        order: Any = None
        if self.device.type == "cuda" and o.stream_order:
            from kvctl_engine.cuda_events import TorchStreamOrder

            order = TorchStreamOrder(self.device.index)
        self.client = kv.connect(o.socket)
        try:
            self.rank = kv.Rank.register(
                self.client,
                "%s/rank%d" % (name, self.group.rank),
                layout,
                memory,
                model_key=o.model_key or self.spec.model_key(),
                namespace=o.namespace,
                world_size=self.group.world_size,
                rank=self.group.rank,
                scheduler=self.scheduler,
                options=kv.RankOptions(staging_buffer_bytes=o.staging_buffer_bytes),
                stream_order=order,
            )
        except BaseException:
            self.client.close()
            raise
        # Ordered by events, the pool needs no device synchronisation around the daemon's calls.
        self.pool.host_sync = order is None

    def close(self) -> None:
        if self.rank is not None:
            try:
                self.rank.close(timeout=self.opts.save_timeout_s)
            finally:
                self.client.close()
                self.rank = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one prompt -----------------------------------------------------------------------------

    def generate(
        self,
        tokens: list[int],
        max_new_tokens: int,
        hooks: Hooks | None = None,
        request_id: str | None = None,
        no_cache: bool = False,
    ) -> Result:
        """Prefills tokens (loading what kvctl has), saves the computed blocks and decodes
        max_new_tokens greedily. no_cache (or an engine without kvctl) computes everything and
        calls nothing."""
        M.check_tokens(self.spec, tokens)
        if max_new_tokens < 1:
            raise ValueError("max new tokens %d: must be positive" % max_new_tokens)
        hooks = hooks or Hooks()
        if self.rank is None or no_cache:
            return self._generate_uncached(tokens, max_new_tokens, hooks)
        rid = request_id or "%s-req%d" % (self.rank.name.rsplit("/", 1)[0], next(self._ids))
        rid = self.group.broadcast(rid)
        return self._generate_cached(tokens, max_new_tokens, hooks, rid)

    def _generate_uncached(self, tokens: list[int], n: int, hooks: Hooks) -> Result:
        t0 = time.perf_counter()
        cache = M.new_cache(self.model)
        logits = M.prefill(self.model, cache, tokens, 0, self.chunk)
        first = int(torch.argmax(logits).item())
        ttft = time.perf_counter() - t0
        toks, lg = M.decode(self.model, cache, logits, n)
        assert toks[0] == first
        res = Result(toks, 0, len(tokens), ttft, len(tokens), logits=lg)
        if hooks.keep_pages:
            res.pages = self._pages_of_cache(cache, len(tokens))
        return res

    def _pages_of_cache(self, cache: Any, n: int) -> dict[int, bytes]:
        """Full blocks' KV as pages would hold it (the regions' bytes in order), for --no-cache."""
        T, out = self.opts.tokens_per_block, {}
        for b in range(n // T):
            parts = []
            for layer in range(self.spec.layers):
                k, v = M.layer_kv(cache, layer, b * T, (b + 1) * T)
                parts += [
                    k.contiguous().view(torch.uint8).cpu().numpy().tobytes(),
                    v.contiguous().view(torch.uint8).cpu().numpy().tobytes(),
                ]
            out[b] = b"".join(parts)
        return out

    def _generate_cached(self, tokens: list[int], n: int, hooks: Hooks, rid: str) -> Result:
        import kvctl_engine as kv
        from kvctl_engine._pb import engine_pb2 as pb

        g, rank, pool = self.group, self.rank, self.pool
        assert pool is not None
        T = self.opts.tokens_per_block
        blocks = -(-len(tokens) // T)
        t0 = time.perf_counter()
        restarts = 0
        failed_offer: int | None = None
        while True:
            matched = 0
            if self.scheduler:
                hit = rank.lookup(kv.Request(rid, tokens), 0)
                if hit.is_async:
                    raise RuntimeError(
                        "lookup of %s answered an asynchronous load; this engine registers synchronous loads" % rid
                    )
                matched = hit.matched_tokens
            matched = g.broadcast(matched)
            if matched % T or matched >= len(tokens):
                raise RuntimeError(
                    "lookup of %s matched %d tokens: not whole blocks of a %d-token prompt"
                    % (rid, matched, len(tokens))
                )
            # The offer that just failed, offered again whole: the pool still holds a page it
            # refuses (one that fails its checksum), so this admission turns the load down and
            # computes the prompt.
            honoured = 0 if failed_offer is not None and matched >= failed_offer else matched
            slots = pool.alloc(blocks)
            try:
                meta = None
                subs = rank.take_submitted_saves()
                if self.scheduler:
                    rank.update_state_after_alloc(rid, [slots], honoured)
                    rd = kv.RequestData(rid, [slots], computed_position=0, num_scheduled_tokens=len(tokens) - honoured)
                    meta = rank.build_meta(new_requests=[rd], submitted_saves=subs).pb.SerializeToString()
                meta = kv.Metadata(pb.Metadata.FromString(g.broadcast(meta)))
                if hooks.before_load is not None:
                    hooks.before_load(rid, honoured)
                tl = time.perf_counter()
                rank.bind_meta(meta)
                rank.start_load()
                failed = set(rank.take_failed_loads())
                load_s = time.perf_counter() - tl
                failed = set().union(*g.gather(sorted(failed)))
            except BaseException:
                pool.release(slots)
                raise
            if rid in failed:
                if self.scheduler:
                    rank.request_reset(rid)
                pool.release(slots)
                restarts += 1
                failed_offer = honoured
                if restarts > 8:
                    raise RuntimeError("request %s: its load failed %d times" % (rid, restarts))
                continue
            break
        try:
            return self._compute(tokens, n, hooks, rid, slots, honoured, t0, restarts, load_s, meta)
        finally:
            pool.release(slots)

    def _compute(
        self,
        tokens: list[int],
        n: int,
        hooks: Hooks,
        rid: str,
        slots: list[int],
        matched: int,
        t0: float,
        restarts: int,
        load_s: float,
        meta: Any,
    ) -> Result:
        g, rank, pool = self.group, self.rank, self.pool
        assert pool is not None
        T = self.opts.tokens_per_block
        loaded = matched // T
        pool.sync_for_daemon()  # without events: the loads landed before kernels read them
        if loaded:
            if hooks.after_load is not None:
                hooks.after_load(pool, slots[:loaded])
            cache = M.cache_from_kv(self.model, pool.read_blocks(slots[:loaded]))
        else:
            cache = M.new_cache(self.model)

        def store(begin: int, end: int) -> None:
            for b in range(begin // T, -(-end // T)):
                lo, hi = max(begin, b * T), min(end, (b + 1) * T)
                for layer in range(self.spec.layers):
                    k, v = M.layer_kv(cache, layer, lo, hi)
                    pool.pages[layer, 0, slots[b], :, lo - b * T : hi - b * T].copy_(k)
                    pool.pages[layer, 1, slots[b], :, lo - b * T : hi - b * T].copy_(v)

        logits = M.prefill(self.model, cache, tokens, matched, self.chunk, on_chunk=store)
        first = int(torch.argmax(logits).item())  # waits for the device
        ttft = time.perf_counter() - t0
        pool.sync_for_daemon()  # without events: the KV is in the pages before the daemon may save it
        saving = False
        if self.scheduler:
            saving = rank.request_finished(rid)
        saving = g.broadcast(saving)
        rank.wait_for_save()
        toks, lg = M.decode(self.model, cache, logits, n)
        assert toks[0] == first
        saved = sum(len(rt.pages) for rt in meta.saves if rt.request_id == rid)
        if saving:
            self._wait_saved(rid)
        res = Result(
            toks,
            matched,
            len(tokens) - matched,
            ttft,
            len(tokens),
            restarts=restarts,
            saved_blocks=saved,
            load_seconds=load_s,
            logits=lg,
        )
        if hooks.keep_pages:
            res.pages = {b: pool.page_bytes_of(slots[b]) for b in range(len(tokens) // T)}
        return res

    def _wait_saved(self, rid: str) -> None:
        """GetFinished on this rank until it reports rid's saves done, then every rank agrees."""
        from kvctl_engine.client import MAX_FINISHED_WAIT

        deadline = time.monotonic() + self.opts.save_timeout_s
        gen = [rid]
        while True:
            # The daemon answers as soon as the saves are done (engine API 1.3); one that answers
            # at once with nothing (an older daemon) is polled every 2 ms.
            asked = time.monotonic()
            fin = self.rank.get_finished(finished_gen=gen, wait=min(MAX_FINISHED_WAIT, max(0.0, deadline - asked)))
            gen = []
            if rid in fin.finished_saving:
                break
            if time.monotonic() > deadline:
                raise SaveTimeout("request %s: its saves did not finish within %.0fs" % (rid, self.opts.save_timeout_s))
            if time.monotonic() - asked < 0.002:
                time.sleep(0.002)
        self.group.gather(True)
