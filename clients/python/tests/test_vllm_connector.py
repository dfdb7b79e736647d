"""kvctl_engine.vllm.KvctlConnector with vLLM's real Scheduler (0.33.0) on the CPU, over a real
kvctl serve (tests/vllm_cpu_engine.py: vLLM's scheduler and the connector's two halves are real;
the model runner is the reference transformers model on the CPU).

- engine A computes a prompt and saves its blocks; engine B (a fresh registration with fresh KV
  memory) is offered the prefix, loads it and generates: its greedy tokens equal the model's
  computing everything, the pages it loaded are the bytes A saved, and the objects in the pool
  are those bytes; a loaded page altered shows in the output (negative control);
- vLLM's kv_load_failure_policy: a page corrupted in the pool fails its load; the connector
  reports the blocks the request was loading; recompute gives the same tokens, fail ends the
  request with an error;
- requests with a cache salt, a LoRA adapter or prompt embeddings;
- asynchronous loads.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import uuid
from types import SimpleNamespace

import pytest

from .conftest import start_daemon
from .hf_support import http_get, require_vllm, tiny_spec

vllm = require_vllm()

from vllm.lora.request import LoRARequest  # noqa: E402

from .test_hf_proof import _corrupt, _segment_mapping  # noqa: E402
from .vllm_cpu_engine import FORMAT, CPUEngine, T, reference  # noqa: E402

pytestmark = pytest.mark.vllm

NEW = 8
POOL_MIB = 77  # a size no other mapping of kvctl serve has: the pool is found by it in /proc


def prompt(seed: int, blocks: int = 5, tail: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(blocks * T + tail)]


@pytest.fixture
def spec():
    return tiny_spec()


@pytest.fixture(autouse=True)
def hashseed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


@pytest.fixture
def model_key() -> str:
    return "vllm-test-" + uuid.uuid4().hex[:10]


@pytest.fixture
def own_pool(kvctl_bin):
    d = start_daemon(kvctl_bin, "%dMiB" % POOL_MIB)
    yield d
    d.kill()
    shutil.rmtree(d.dir, ignore_errors=True)


def assert_token_exact(out, want, what: str, tol: float = 1e-5) -> None:
    """Tokens equal and every step's logits within tol of the model computing everything."""
    assert out.tokens == want.tokens, "%s: tokens differ from the model computing everything" % what
    assert len(out.logits) == len(want.logits), what
    for i in range(len(want.tokens)):
        d = float((out.logits[i] - want.logits[i]).abs().max())
        assert d <= tol, "%s: step %d's logits differ by %g" % (what, i, d)


def run_one(socket: str, spec, key: str, rid: str, toks: list[int], **kw):
    extra = {"model_key": key, **kw.pop("extra", {})}
    add = kw.pop("add", {})
    e = CPUEngine(socket, spec, extra=extra, **kw)
    try:
        e.add(rid, toks, NEW, **add)
        out = e.run()[rid]
        return e, out
    finally:
        e.close()


def pool_keys(kvctl_bin: str, e: CPUEngine, toks: list[int]) -> list[str]:
    """The pool keys of toks' full blocks under e's registration, from `kvctl hash`."""
    page = sum(r.size for r in e.worker.worker.registration.layout.groups[0].regions)
    args = [kvctl_bin, "hash", "--tokens-file", "-", "--keys-only", "--tokens-per-block", str(T)]
    if FORMAT == "trtllm":
        args += ["--model-key", e.worker.settings.model_key, "--layer-group", "0:%d" % page]
    else:
        args += ["--format", FORMAT, "--python-hash-seed", "0", "--model", e.vc.model_config.model]
        args += ["--num-kv-heads", str(e.spec.kv_heads)]
    out = subprocess.run(args, input=" ".join(map(str, toks)), capture_output=True, text=True, check=True)
    return out.stdout.split()


def pool_object(d, key: str) -> bytes:
    """key's object as the embedded pool holds it, read from kvctl serve's memory."""
    code, body = http_get(d.admin + "/batch_query_keys?keys=" + key)
    assert code == 200, body
    v = json.loads(body)["data"][key]["values"][0]
    code, body = http_get(d.admin + "/get_segments_detail")
    seg = json.loads(body)["segments"][0]
    start = _segment_mapping(d.proc.pid, POOL_MIB << 20) + v["buffer_address_"] - int(seg["base_address"], 16)
    with open("/proc/%d/mem" % d.proc.pid, "rb") as f:
        f.seek(start)
        return f.read(v["size_"])


def vllm_store_keys(e: CPUEngine, toks: list[int], **req: object) -> list[str]:
    """The keys vLLM's own MooncakeStoreConnector (0.33.0, its rank-local layout) names for toks'
    full blocks on TP rank 0: vLLM's request block hashes under vLLM's PoolKey."""
    import os

    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import KeyMetadata, PoolKey
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    r = Request(
        request_id="keys",
        prompt_token_ids=list(toks),
        sampling_params=vllm.SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=kv_cache_utils.get_request_block_hasher(T, get_hash_fn_by_name("sha256")),
        **req,
    )
    meta = KeyMetadata(
        model_name=os.path.basename(e.vc.model_config.model.rstrip("/")), tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0
    )
    return [PoolKey(meta, bytes(h).hex()).to_string() for h in r.block_hashes]


def pool_key_set(d) -> set[str]:
    code, body = http_get(d.admin + "/get_all_keys")
    assert code == 200, body
    return {k for k in body.decode().split("\n") if k}


def test_cold_then_warm_is_token_exact(kvctl_bin, own_pool, spec, model_key) -> None:
    toks = prompt(1)
    want = reference(spec, toks, NEW)
    a, out_a = run_one(own_pool.socket, spec, model_key, "a", toks)
    assert_token_exact(out_a, want, "A (cold)")
    assert a.loaded.get("a", 0) == 0
    assert len(a.saved_blocks["a"]) == 5, a.saved_blocks
    assert a.finished_sending == ["a"], "vLLM held A's blocks until the daemon reported its saves"
    saved = a.final_values["a"]
    assert len(saved) == 5

    # The pool holds, under each block's key, the bytes of that block in A's memory: vLLM's
    # Mooncake store value (test_vllm_layout.py checks the region order against vLLM's).
    keys = pool_keys(kvctl_bin, a, toks)
    assert len(keys) == 5
    for i, k in enumerate(keys):
        assert pool_object(own_pool, k) == saved[i], "block %d: the pool object is not A's block" % i
    if FORMAT == "vllm":
        # ... and the keys are the ones vLLM's own Mooncake store connector names for the prompt.
        assert keys == vllm_store_keys(a, toks)
        assert set(keys) <= pool_key_set(own_pool)

    b, out_b = run_one(own_pool.socket, spec, model_key, "b", toks)
    assert b.loaded["b"] == 5 * T, "B should load the five whole blocks of the prompt"
    assert_token_exact(out_b, want, "B (loaded)")
    for i, blk in enumerate(b.load_blocks["b"]):
        assert b.loaded_values[blk] == saved[i], "block %d: B loaded other bytes than A saved" % i
    assert "b" not in b.saved_blocks, "B saved blocks it loaded"

    # Negative control: the same load with one loaded value altered must show.
    def alter(e: CPUEngine, so) -> None:
        for blocks in e.load_blocks.values():
            e.views[e.names[0]][blocks[2], 0, 0, 0] += 1.0

    c = CPUEngine(own_pool.socket, spec, extra={"model_key": model_key})
    try:
        c.after_load = alter
        c.add("c", toks, NEW)
        out_c = c.run()["c"]
    finally:
        c.close()
    assert c.loaded["c"] == 5 * T
    assert out_c.tokens != want.tokens or any(
        float((out_c.logits[i] - want.logits[i]).abs().max()) > 1e-5 for i in range(NEW)
    ), "an altered loaded page gave the model's own output: the check cannot see wrong KV"


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_load_failure_policy(kvctl_bin, own_pool, spec, model_key, policy: str) -> None:
    """A page corrupted in the pool fails its checksum at load: the worker reports the blocks the
    request was loading (get_block_ids_with_load_errors) and vLLM applies the policy."""
    toks = prompt(2)
    want = reference(spec, toks, NEW)
    a, _ = run_one(own_pool.socket, spec, model_key, "a", toks)
    keys = pool_keys(kvctl_bin, a, toks)
    _corrupt(SimpleNamespace(admin=own_pool.admin, pid=own_pool.proc.pid), keys[3], POOL_MIB << 20)

    errors: list[set[int]] = []
    b = CPUEngine(own_pool.socket, spec, extra={"model_key": model_key}, policy=policy)
    orig = b.worker.get_block_ids_with_load_errors

    def spy() -> set[int]:
        got = orig()
        if got:
            errors.append(set(got))
        return got

    b.worker.get_block_ids_with_load_errors = spy  # type: ignore[method-assign]
    try:
        b.add("b", toks, NEW)
        out = b.run()["b"]
        loading = set(b.load_blocks["b"])
        assert errors == [loading], "the reported blocks are the ones the failed load filled"
        if policy == "recompute":
            assert out.finish == "length", out.finish
            assert_token_exact(out, want, "recomputed after a failed load")
            # The daemon forgot the request and the recomputed blocks were saved again.
            assert len(b.saved_blocks["b"]) == 5, b.saved_blocks
        else:
            assert out.finish == "error", out.finish
            assert out.tokens == []
    finally:
        b.close()
    assert own_pool.proc.poll() is None


def test_cache_salt_and_lora_separate_pages(own_pool, spec, model_key) -> None:
    toks = prompt(3)
    want = reference(spec, toks, NEW)
    lora = LoRARequest("adapter-a", 7, "/adapters/a")
    run_one(own_pool.socket, spec, model_key, "salted", toks, add={"cache_salt": "tenant-1"})
    run_one(own_pool.socket, spec, model_key, "lora", toks, add={"lora_request": lora})
    cases = [
        ("same salt", {"cache_salt": "tenant-1"}, 5 * T),
        ("another salt", {"cache_salt": "tenant-2"}, 0),
        ("no salt, no adapter", {}, 0),
        ("same adapter", {"lora_request": lora}, 5 * T),
        ("another adapter", {"lora_request": LoRARequest("adapter-b", 8, "/adapters/b")}, 0),
    ]
    for what, add, loaded in cases:
        e, out = run_one(own_pool.socket, spec, model_key, "r", toks, add=add)
        assert e.loaded.get("r", 0) == loaded, what
        # The stand-in model has no adapters: the tokens are the base model's either way.
        assert_token_exact(out, want, what)


@pytest.mark.skipif(FORMAT != "vllm", reason="vLLM's keys")
@pytest.mark.parametrize("kind", ["cache_salt", "lora"])
def test_salted_and_lora_keys_are_vllms(own_pool, spec, model_key, kind: str) -> None:
    toks = prompt(6)
    add = {"cache_salt": "tenant-1"} if kind == "cache_salt" else {"lora_request": LoRARequest("ad", 3, "/ad")}
    e, _ = run_one(own_pool.socket, spec, model_key, "r", toks, add=add)
    want = vllm_store_keys(e, toks, **add)
    assert len(want) == 5
    assert set(want) <= pool_key_set(own_pool), "kvctl serve saved the pages under other keys than vLLM names"


def test_prompt_embeds_are_neither_looked_up_nor_saved(own_pool, spec, model_key) -> None:
    from kvctl_engine.hf import model as M

    toks = prompt(4)
    want = reference(spec, toks, NEW)
    run_one(own_pool.socket, spec, model_key, "plain", toks)
    m = M.build_model(spec)
    embeds = m.model.embed_tokens(__import__("torch").tensor(toks)).detach()
    # The stand-in runner computes from the token ids, whose embeddings these are.
    e, out = run_one(own_pool.socket, spec, model_key, "emb", toks, add={"prompt_embeds": embeds})
    assert e.loaded.get("emb", 0) == 0
    assert "emb" not in e.saved_blocks
    assert e.finished_sending == []
    assert_token_exact(out, want, "prompt embeds")


def test_async_load_is_token_exact(own_pool, spec, model_key) -> None:
    toks = prompt(5, blocks=6, tail=3)
    want = reference(spec, toks, NEW)
    run_one(own_pool.socket, spec, model_key, "a", toks)
    e, out = run_one(own_pool.socket, spec, model_key, "b", toks, extra={"async_load": True})
    assert e.async_requests == {"b"}, "the load should have been asynchronous"
    assert e.loaded["b"] == 6 * T
    assert_token_exact(out, want, "after an asynchronous load")


def test_chunked_prefill_and_preemption_save_every_block(own_pool, spec, model_key) -> None:
    """A token budget of three blocks splits the prompts into chunks, and 14 blocks are too few for
    three requests decoding 40 tokens each, so vLLM preempts requests mid-flight (their saves are
    drained first, their state reset in the daemon). Every request still ends with the model's
    tokens, and a fresh engine then loads every prompt's full blocks.

    The budget splits some prompts inside a block (a chunk of 19 tokens, then one from 19 to 66),
    so the model multiplies other shapes than the reference's block-sized chunks: logits agree
    to 1e-4 rather than fp32's last bits, the tokens exactly."""
    n = 40
    prompts = {"p%d" % i: prompt(10 + i, blocks=4, tail=13) for i in range(3)}
    want = {rid: reference(spec, t, n) for rid, t in prompts.items()}
    e = CPUEngine(own_pool.socket, spec, extra={"model_key": model_key}, budget=3 * T, num_blocks=14)
    try:
        for rid, t in prompts.items():
            e.add(rid, t, n)
        outs = e.run()
    finally:
        e.close()
    assert e.preempted, "the test needs vLLM to preempt a request"
    for rid in prompts:
        assert_token_exact(outs[rid], want[rid], rid, tol=1e-4)
    # Again, in an engine as small that loads in the background: loads, saves and preemptions
    # interleave.
    f = CPUEngine(
        own_pool.socket, spec, extra={"model_key": model_key, "async_load": True}, budget=3 * T, num_blocks=14
    )
    try:
        for rid, t in prompts.items():
            f.add(rid + "-again", t, n)
        outs = f.run()
    finally:
        f.close()
    assert f.preempted, "the second engine should preempt too"
    for rid in prompts:
        assert f.loaded[rid + "-again"] >= 4 * T, rid
        assert rid + "-again" in f.async_requests
        assert_token_exact(outs[rid + "-again"], want[rid], rid + " again", tol=1e-4)
