"""kvctl hash's vLLM keys against the block hashes of the installed vLLM (0.33.0, make vllmenv):
its own request block hasher over prompts with a cache salt, a LoRA adapter and multimodal items
at block boundaries, for both of its SHA-256 hash functions (xxhash is not installed there)."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

T = 16


def vllm_hashes(mp: pytest.MonkeyPatch, algo: str, seed: str, tokens: list[int], **add: Any) -> list[str]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    mp.setenv("PYTHONHASHSEED", seed)
    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)
    hasher = kv_cache_utils.get_request_block_hasher(T, fn)
    r = Request("r", tokens, SamplingParams(max_tokens=1), None, block_hasher=hasher, **add)
    return [bytes(h).hex() for h in r.block_hashes]


def kvctl_hashes(kvctl_bin: str, fmt: str, seed: str, tokens: list[int], *flags: str) -> list[str]:
    out = subprocess.run(
        [
            kvctl_bin,
            "hash",
            "--format",
            fmt,
            "--python-hash-seed",
            seed,
            "--model",
            "m",
            "--vllm-extra-keys",
            "tagged",
            "-o",
            "json",
            *flags,
        ]
        + [str(t) for t in tokens],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [b["hash"] for b in json.loads(out)["blocks"]]


@pytest.mark.parametrize(("algo", "fmt"), [("sha256", "vllm"), ("sha256_cbor", "vllm-sha256-cbor")])
def test_tagged_extra_keys_are_vllms(kvctl_bin: str, monkeypatch: pytest.MonkeyPatch, algo: str, fmt: str) -> None:
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    rng = random.Random(5)
    cases = 0
    for i in range(12):
        tokens = [rng.randrange(150000) for _ in range(T * 5 + 3)]
        add: dict[str, Any] = {}
        flags: list[str] = []
        if i % 2 == 0:
            add["cache_salt"] = f"tenant-{i}"
            flags += ["--cache-salt", add["cache_salt"]]
        if i % 3 == 0:
            add["lora_request"] = LoRARequest(f"ad{i}", i + 1, f"/adapters/ad{i}")
            flags += ["--lora-name", f"ad{i}", "--lora-path", f"/adapters/ad{i}"]
        if i % 4 != 3:
            # Items that end exactly on a block boundary, span blocks, and start at one: the
            # boundary rules differ from vLLM's earlier extra keys.
            spans = [(2, T - 2), (T + 4, T), (3 * T, 5)]
            add["mm_features"] = [
                MultiModalFeatureSpec(
                    data=None, modality="image", identifier=f"img{j}-{i}", mm_position=PlaceholderRange(o, n)
                )
                for j, (o, n) in enumerate(spans)
            ]
            for j, (o, n) in enumerate(spans):
                flags += ["--mm-feature", f"img{j}-{i}:{o}:{n}"]
        want = vllm_hashes(monkeypatch, algo, "0", tokens, **add)
        assert len(want) == 5
        assert kvctl_hashes(kvctl_bin, fmt, "0", tokens, *flags) == want, f"case {i}: {add}"
        cases += 1
    assert cases == 12


def test_unset_seed_is_vllms_fixed_default(kvctl_bin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = list(range(2 * T))
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(get_hash_fn_by_name("sha256"))
    assert kv_cache_utils.get_none_hash_seed() == "vllm-none-hash"
    want = vllm_hashes(monkeypatch, "sha256", "vllm-none-hash", tokens)
    assert kvctl_hashes(kvctl_bin, "vllm", "vllm-none-hash", tokens) == want
