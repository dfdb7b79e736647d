"""The reference engine's proof on one `kvctl serve` (embedded pool): KV that went through kvctl
gives the model's own output, and wrong KV would be seen.

"Full recompute" is the same engine without kvctl (--no-cache), prefilling in the same
block-sized chunks: block b's K and V then come from the same inputs through the same shapes
whether earlier blocks were loaded or computed, so a correct load reproduces the recompute's
logits bit for bit (the tests allow fp32's 1e-5). A recompute of the whole prompt in one chunk
differs from chunked prefill by about 1e-5 already (different matmul shapes), which is why it is
not the reference.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from .hf_support import (
    TINY,
    TPB,
    Serve,
    alter_block,
    assert_differs,
    assert_same_output,
    cached_run,
    http_get,
    load_dump,
    max_diff,
    prompt,
    recompute,
    run_engine,
    tiny_spec,
    write_tokens,
)


def test_random_model_output_is_varied(device: str) -> None:
    """At transformers' default initialisation a random Llama repeats one token; the engine's
    scaled weights must give varied greedy output, or token equality would prove little."""
    from kvctl_engine.hf import model as M

    m = M.build_model(tiny_spec(), device)
    prompts = [prompt(1), prompt(2, blocks=2), list(range(10, 10 + 40)), [5] * 33]
    for p in prompts:
        cache = M.new_cache(m)
        logits = M.prefill(m, cache, p, 0, TPB)
        toks, _ = M.decode(m, cache, logits, 24)
        assert len(set(toks)) >= 8, "24 greedy tokens hold only %d distinct: %s" % (len(set(toks)), toks)


def test_chunked_prefill_is_bitwise_repeatable(device: str) -> None:
    """The premise of the comparison: a prefix's K/V computed once and handed to a fresh cache
    continues exactly as computing everything does."""
    from kvctl_engine.hf import model as M

    m = M.build_model(tiny_spec(), device)
    p = prompt(3)
    full = M.new_cache(m)
    want = M.prefill(m, full, p, 0, TPB)
    kv = [M.layer_kv(full, layer, 0, 3 * TPB) for layer in range(2)]
    part = M.cache_from_kv(m, [(k.clone(), v.clone()) for k, v in kv])
    got = M.prefill(m, part, p, 3 * TPB, TPB)
    assert torch.equal(got, want)


def test_process_b_continues_what_process_a_saved(kvctl_bin: str, device: str, tmp_path: Path) -> None:
    """§5.1: process A computes and saves a prompt; a fresh process B, same model seed, loads the
    prefix and continues. The loaded bytes equal A's, B's 32 greedy tokens equal the full
    recompute's, the logits agree within 1e-5. Negative control: the same load with one loaded
    page altered differs."""
    serve = Serve(kvctl_bin, tmp_path, "one")
    try:
        toks = prompt(11)
        f = write_tokens(tmp_path / "p.json", toks)
        common = [
            "generate",
            "--socket",
            serve.socket,
            "--tokens-file",
            f,
            "--max-new-tokens",
            "32",
            "--device",
            device,
            "--tokens-per-block",
            str(TPB),
            *TINY,
        ]
        a = run_engine([*common, "--dump", str(tmp_path / "a.pt")])
        assert (a["loaded_tokens"], a["computed_tokens"]) == (0, len(toks))
        assert a["saved_blocks"] == 6, a
        b = run_engine([*common, "--dump", str(tmp_path / "b.pt")])
        assert (b["loaded_tokens"], b["computed_tokens"]) == (6 * TPB, len(toks) - 6 * TPB), b

        da, db = load_dump(str(tmp_path / "a.pt")), load_dump(str(tmp_path / "b.pt"))
        for blk in range(6):
            assert db["pages"][blk] == da["pages"][blk], "block %d: B loaded bytes other than A computed" % blk

        ref = recompute(device, toks)
        assert ref.pages == da["pages"], "A's pages are not the recompute's KV"
        assert b["tokens"] == ref.tokens == a["tokens"]
        assert max_diff(db["logits"], torch.stack(ref.logits)) <= 1e-5
        assert max_diff(da["logits"], torch.stack(ref.logits)) <= 1e-5

        # Negative control, in a fresh engine over the same pool.
        bad = cached_run(device, serve.socket, toks, after_load=alter_block(2))
        assert bad.loaded_tokens == 6 * TPB
        assert_differs(bad, ref, "one page altered after its load")
        # ... and through the command line's flag.
        badc = run_engine([*common, "--alter-loaded-block", "4", "--dump", str(tmp_path / "c.pt")])
        assert badc["loaded_tokens"] == 6 * TPB
        dc = load_dump(str(tmp_path / "c.pt"))
        assert badc["tokens"] != ref.tokens or max_diff(dc["logits"], torch.stack(ref.logits)) > 1e-5
    finally:
        serve.close()


def _segment_mapping(pid: int, size: int) -> int:
    """The start of the one mapping of exactly size bytes in pid: the embedded pool's segment."""
    found = []
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if hi - lo == size and "rw" in line.split()[1]:
                found.append(lo)
    if len(found) != 1:
        pytest.fail("kvctl serve %d: %d mappings of %d bytes, want the pool's one" % (pid, len(found), size))
    return found[0]


def _corrupt(serve: Serve, key: str, pool_bytes: int) -> None:
    """Flips one byte of key's page where it lies in the embedded pool's memory (the serve
    process is this one's child, so /proc/PID/mem may write it)."""
    import json

    code, body = http_get(serve.admin + "/batch_query_keys?keys=" + key)
    assert code == 200, body
    addr = json.loads(body)["data"][key]["values"][0]["buffer_address_"]
    code, body = http_get(serve.admin + "/get_segments_detail")
    seg = json.loads(body)["segments"][0]
    off = addr - int(seg["base_address"], 16)
    real = _segment_mapping(serve.pid, pool_bytes) + off + 100
    fd = os.open("/proc/%d/mem" % serve.pid, os.O_RDWR)
    try:
        before = os.pread(fd, 1, real)
        os.pwrite(fd, bytes([before[0] ^ 0x5A]), real)
        assert os.pread(fd, 1, real) != before
    finally:
        os.close(fd)


def test_corrupted_page_is_never_consumed(kvctl_bin: str, device: str, tmp_path: Path) -> None:
    """§5.3: a page corrupted in the pool fails its checksum and is not loaded; the engine is
    handed the request back, computes instead, and the same tokens come out."""
    pool_bytes = 77 << 20  # a size no other mapping of the process has
    serve = Serve(kvctl_bin, tmp_path, "corrupt", pool_size="77MiB")
    try:
        toks = prompt(12)
        a = cached_run(device, serve.socket, toks)
        assert a.saved_blocks == 6
        ref = recompute(device, toks)
        assert_same_output(a, ref, "A")

        # Negative control first, while the pool is intact.
        bad = cached_run(device, serve.socket, toks, after_load=alter_block(1))
        assert bad.loaded_tokens == 6 * TPB
        assert_differs(bad, ref, "one page altered after its load")

        out = (
            __import__("subprocess")
            .run(
                [
                    kvctl_bin,
                    "hash",
                    "--tokens-file",
                    "-",
                    "--keys-only",
                    "--tokens-per-block",
                    str(TPB),
                    "--model-key",
                    tiny_spec().model_key(),
                    "--layer-group",
                    "0:%d" % (2 * 2 * 2 * TPB * 16 * 4),
                ],
                input=" ".join(map(str, toks)),
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.split()
        )
        assert len(out) == 6
        _corrupt(serve, out[3], pool_bytes)

        b = cached_run(device, serve.socket, toks)
        assert b.restarts >= 1, "the corrupted page's load was not handed back"
        assert b.loaded_tokens == 0
        assert_same_output(b, ref, "after the corruption")
        assert serve.stats()["pool"]["checksum_errors"] >= 1
    finally:
        serve.close()
