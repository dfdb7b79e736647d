"""A vLLM engine on the CPU for the connector's tests: vLLM's real ``Scheduler`` (0.33.0, built as
vLLM's connector unit tests build one: a local model config, no weights) and two real
``KvctlConnector`` halves (the scheduler's, attached through vLLM's handshake, and the worker's,
registering vLLM-layout KV views in shared memory with a real kvctl serve), driven in the order of
vLLM's engine core and ``ActiveKVConnector`` (vllm/v1/worker/gpu/kv_connector.py).

The stand-in is the GPU model runner: the forward pass is the reference transformers model
(``kvctl_engine.hf``), which reads the KV of computed tokens from the vLLM-layout pages of each
request's blocks and writes the KV it computes into them, block-sized chunk by block-sized
chunk, as ``kvctl_engine.hf`` does; greedy sampling. So a prompt whose prefix was loaded
through the connector gives exactly the tokens (and, within fp32's last bits, the logits) of the
same model computing everything.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, create_kv_cache_views
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvctl_engine.hf import model as M
from kvctl_engine.vllm import memory as kvmemory

#: The key scheme the tests register with: "vllm", the scheme of vLLM's default
#: --prefix-caching-hash-algo (sha256). KVCTL_VLLM_TEST_FORMAT=trtllm runs them under
#: TensorRT-LLM's keys instead (the connector's format setting).
FORMAT = os.environ.get("KVCTL_VLLM_TEST_FORMAT", "vllm")

T = 16  # vLLM's block size

_hash_ready = False


_models = tempfile.mkdtemp(prefix="kvvllm-models-")
atexit.register(shutil.rmtree, _models, True)


def model_dir(spec: M.ModelSpec, name: str) -> str:
    """A local model directory named name, holding only spec's config.json (no weights, no
    tokenizer). vLLM's keys hold the model's last path element: engines of one name share pages."""
    d = os.path.join(_models, name)
    os.makedirs(d, exist_ok=True)
    cfg = spec.config().to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = spec.dtype
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def vllm_config(
    spec: M.ModelSpec,
    name: str,
    extra: dict[str, Any],
    *,
    policy: str = "fail",
    kv_role: str = "kv_both",
    layout: str = "LBHNC",
    budget: int = 512,
    hash_algo: str = "sha256",
) -> VllmConfig:
    mc = ModelConfig(
        model=model_dir(spec, name),
        dtype=spec.dtype,
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=spec.max_positions,
    )
    sc = SchedulerConfig(
        max_num_seqs=16,
        max_num_batched_tokens=budget,
        max_model_len=spec.max_positions,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cc = CacheConfig(block_size=T, enable_prefix_caching=True, prefix_caching_hash_algo=hash_algo)
    cc.kv_cache_layout = layout
    kt = KVTransferConfig(
        kv_connector="KvctlConnector",
        kv_connector_module_path="kvctl_engine.vllm",
        kv_role=kv_role,
        kv_connector_extra_config=extra,
        kv_load_failure_policy=policy,
        engine_id="test-" + uuid.uuid4().hex[:12],
    )
    return VllmConfig(
        model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kt, device_config=DeviceConfig("cpu")
    )


def layer_names(spec: M.ModelSpec) -> list[str]:
    return ["model.layers.%d.self_attn.attn" % i for i in range(spec.layers)]


def attention_spec(spec: M.ModelSpec) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=T, num_kv_heads=spec.kv_heads, head_size=spec.head_dim, dtype=spec.torch_dtype)


def allocate(vc: VllmConfig, spec: M.ModelSpec, num_blocks: int) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """vLLM's KV cache config for num_blocks blocks in the configured layout, and its per-layer
    views over a kvctl shared-memory buffer (vLLM's allocate_kv_cache, with host_kv_buffer in
    place of torch.zeros)."""
    aspec = attention_spec(spec)
    groups = [KVCacheGroupSpec(layer_names(spec), aspec)]
    kvc = get_kv_cache_config_from_groups(vc, groups, num_blocks * spec.layers * aspec.page_size_bytes)
    layout = vc.cache_config.get_resolved_kv_cache_layout()
    size = kvc.kv_cache_tensors[0].size
    shm, buf = kvmemory.host_kv_buffer(size)
    views: dict[str, torch.Tensor] = {}
    for t in kvc.kv_cache_tensors:
        views.update(zip(t.layers, create_kv_cache_views(buf, aspec, kvc.num_blocks, layout, t), strict=True))
    return kvc, shm, views


def init_hashing(algo: str = "sha256") -> None:
    """NONE_HASH, as vLLM's engine core sets it once per process (reads PYTHONHASHSEED)."""
    global _hash_ready
    if not _hash_ready:
        kv_cache_utils.init_none_hash(get_hash_fn_by_name(algo))
        _hash_ready = True


@dataclass
class Output:
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    finish: str = ""


class CPUEngine:
    """One vLLM engine instance: a scheduler and one worker (TP 1) over kvctl serve."""

    def __init__(
        self,
        socket: str,
        spec: M.ModelSpec,
        *,
        num_blocks: int = 48,
        policy: str = "fail",
        layout: str = "LBHNC",
        budget: int = 512,
        extra: dict[str, Any] | None = None,
        model: Any = None,
    ) -> None:
        from kvctl_engine.vllm import KvctlConnector

        init_hashing()
        self.spec = spec
        cfg = {"socket": socket, "format": FORMAT, "model_key": spec.model_key()}
        cfg.update(extra or {})
        self.vc = vllm_config(spec, cfg["model_key"], cfg, policy=policy, layout=layout, budget=budget)
        self.kvc, self.shm, self.views = allocate(self.vc, spec, num_blocks)
        self.vc.cache_config.num_gpu_blocks = self.kvc.num_blocks
        self.worker = KvctlConnector(self.vc, KVConnectorRole.WORKER, self.kvc)
        self.worker.register_kv_caches(self.views)
        self.scheduler = Scheduler(
            vllm_config=self.vc,
            kv_cache_config=self.kvc,
            structured_output_manager=StructuredOutputManager(self.vc),
            log_stats=True,
            block_size=T,
        )
        # EngineCore._set_kv_connector_handshake_metadata: every worker's, keyed (pp, tp).
        self.scheduler.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): self.worker.get_handshake_metadata()})
        self.model = model if model is not None else M.build_model(spec)
        self.names = layer_names(spec)
        self.blocks: dict[str, list[int]] = {}
        self.out: dict[str, Output] = {}
        self.steps = 0
        # Per request: the blocks its synchronous load filled, their tokens, and each loaded
        # block's bytes right after the load; the block list it finished with.
        self.load_blocks: dict[str, list[int]] = {}
        self.loaded: dict[str, int] = {}
        self.loaded_values: dict[int, bytes] = {}
        self.last_blocks: dict[str, list[int]] = {}
        self.final_values: dict[str, list[bytes]] = {}
        self.prompt_len: dict[str, int] = {}  # the prompt's full blocks when it finished
        # Blocks of asynchronous loads until they are reported done, and the pages each request's
        # saves named.
        self.async_blocks: dict[str, list[int]] = {}
        self.saved_blocks: dict[str, list[int]] = {}
        self.finished_sending: list[str] = []
        self.async_requests: set[str] = set()
        self.preempted: list[str] = []
        # Hooks: after_load(engine, scheduler_output) runs after the step's synchronous loads.
        self.after_load: Any = None
        self.before_load: Any = None

    # -- requests -------------------------------------------------------------------------------

    def add(self, rid: str, tokens: list[int], max_tokens: int = 8, **kw: Any) -> None:
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        req = Request(
            request_id=rid,
            prompt_token_ids=list(tokens),
            sampling_params=sp,
            pooling_params=None,
            block_hasher=kv_cache_utils.get_request_block_hasher(T, get_hash_fn_by_name("sha256")),
            **kw,
        )
        self.scheduler.add_request(req)
        self.out[rid] = Output()
        self.prompt_len[rid] = len(tokens)

    def run(self, max_steps: int = 500) -> dict[str, Output]:
        for _ in range(max_steps):
            if not self.scheduler.has_requests():
                return self.out
            self.step()
        raise AssertionError("requests still unfinished after %d steps" % max_steps)

    # -- KV pages ---------------------------------------------------------------------------------

    def read_kv(self, blocks: list[int], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, K and V of the first n tokens held by blocks: (kv_heads, n, head_dim)."""
        D = self.spec.head_dim
        idx = torch.tensor(blocks[: -(-n // T)], dtype=torch.long)
        out = []
        for name in self.names:
            v = self.views[name][idx]  # (blocks, H, N, 2D)
            v = v.permute(1, 0, 2, 3).reshape(v.shape[1], -1, v.shape[3])[:, :n]
            out.append((v[..., :D].contiguous(), v[..., D:].contiguous()))
        return out

    def write_kv(self, cache: Any, blocks: list[int], begin: int, end: int) -> None:
        D = self.spec.head_dim
        for b in range(begin // T, -(-end // T)):
            lo, hi = max(begin, b * T), min(end, (b + 1) * T)
            for layer, name in enumerate(self.names):
                k, v = M.layer_kv(cache, layer, lo, hi)
                page = self.views[name][blocks[b]]
                page[:, lo - b * T : hi - b * T, :D] = k
                page[:, lo - b * T : hi - b * T, D:] = v

    def block_value(self, block: int) -> bytes:
        """Block's bytes in the order kvctl serve moves them (the registered regions)."""
        regs = kvmemory.block_regions(self.views, self.names, self.kvc.num_blocks)
        return kvmemory.block_bytes(regs, block)

    # -- one engine step ----------------------------------------------------------------------------

    def step(self) -> None:
        so = self.scheduler.schedule()
        self.steps += 1
        meta = so.kv_connector_metadata
        w = self.worker
        for nr in so.scheduled_new_reqs:
            self.blocks[nr.req_id] = list(nr.block_ids[0])
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            ids = cr.new_block_ids[i]
            if rid in cr.resumed_req_ids:
                self.blocks[rid] = list(ids[0]) if ids else []
            elif ids:
                self.blocks[rid].extend(ids[0])
        if so.new_block_ids_to_zero:
            # vLLM zeroes freshly allocated blocks; NaN instead, so that a load that writes
            # nothing, or a read of a block nothing wrote, cannot pass for KV.
            idx = torch.tensor(sorted(so.new_block_ids_to_zero), dtype=torch.long)
            for name in self.names:
                self.views[name][idx] = float("nan")

        # ActiveKVConnector.pre_forward
        self.preempted.extend(meta.preempted)
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        if meta.meta:
            m = meta.message()
            for t in m.async_loads:
                self.async_blocks[t.request_id] = [p.page for p in t.pages]
                self.async_requests.add(t.request_id)
            for t in m.saves:
                self.saved_blocks.setdefault(t.request_id, []).extend(p.page for p in t.pages)
        if self.before_load is not None:
            self.before_load(self, so)
        if so.has_sync_kv_loads:
            w.start_load_kv(None)
            for t in meta.message().loads:
                pages = [p.page for p in t.pages]
                self.load_blocks[t.request_id] = pages
                self.loaded[t.request_id] = self.loaded.get(t.request_id, 0) + len(pages) * T
                for p in pages:
                    self.loaded_values[p] = self.block_value(p)
        if self.after_load is not None:
            self.after_load(self, so)

        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        computed.update(zip(cr.req_ids, cr.num_computed_tokens, strict=True))
        req_ids, sampled, step_logits = [], [], {}
        for rid, n in so.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            start = computed[rid]
            toks = list(req.all_token_ids)[: start + n]
            logits = self.forward(toks, start, self.blocks[rid])
            req_ids.append(rid)
            if start + n >= req.num_tokens:
                tok = int(torch.argmax(logits).item())
                sampled.append([tok])
                step_logits[rid] = logits
            else:
                sampled.append([])

        # ActiveKVConnector.post_forward
        if not so.has_sync_kv_loads:
            w.start_load_kv(None)
        w.wait_for_save()
        res = w.get_transfer_results(so.finished_req_ids)
        kvo = KVConnectorOutput(
            finished_sending=res.finished_sending or None,
            finished_recving=res.finished_recving or None,
            failed_recving=res.failed_recving,
            invalid_block_ids=w.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=w.build_connector_worker_meta(),
        )
        w.clear_connector_metadata()
        for rid in res.finished_recving:
            pages = self.async_blocks.pop(rid, [])
            self.load_blocks[rid] = pages
            self.loaded[rid] = self.loaded.get(rid, 0) + len(pages) * T
            for p in pages:
                self.loaded_values[p] = self.block_value(p)
        self.finished_sending.extend(res.finished_sending)
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=kvo,
        )
        outs = self.scheduler.update_from_output(so, mro)
        for eco in outs.values():
            for o in eco.outputs:
                got = self.out[o.request_id]
                got.tokens.extend(o.new_token_ids)
                if o.new_token_ids:
                    # vLLM drops the sample of a request whose load failed this step.
                    got.logits.append(step_logits[o.request_id])
                if o.finish_reason is not None:
                    got.finish = str(o.finish_reason)
                    blocks = self.blocks.pop(o.request_id, [])
                    self.last_blocks[o.request_id] = blocks
                    full = self.prompt_len[o.request_id] // T
                    self.final_values[o.request_id] = [self.block_value(b) for b in blocks[:full]]

    @torch.no_grad()
    def forward(self, tokens: list[int], start: int, blocks: list[int]) -> torch.Tensor:
        """Computes tokens[start:] over the KV of tokens[:start] held by blocks, in chunks that end
        on block boundaries, writing the new KV into the blocks; the last token's logits."""
        if start:
            cache = M.cache_from_kv(self.model, self.read_kv(blocks, start))
        else:
            cache = M.new_cache(self.model)
        return M.prefill(self.model, cache, tokens, start, T, on_chunk=lambda b, e: self.write_kv(cache, blocks, b, e))

    def close(self) -> None:
        self.scheduler.shutdown()
        self.worker.shutdown()
        kvmemory.release_host_kv_buffer(self.shm)


def reference(spec: M.ModelSpec, tokens: list[int], n: int) -> Any:
    """The model computing everything (kvctl_engine.hf without kvctl, block-sized chunks)."""
    from kvctl_engine.hf import Engine, EngineOptions

    with Engine(EngineOptions(spec=spec, tokens_per_block=T, use_cache=False)) as e:
        return e.generate(tokens, n)


def _layout(name: str) -> KVCacheLayout:
    return KVCacheLayout[name]
