"""The reference engine's proof over a real Mooncake cluster: `kvctl serve --pool-backend mooncake`
hosts on one real mooncake_master (KVCTL_PYENV; skipped without it, failed under CI=true).

Full recompute, as in test_hf_proof: the same engine without kvctl, prefilling in the same
block-sized chunks, so correct KV reproduces its logits bit for bit (compared within 1e-5).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from .hf_support import (
    TINY,
    TPB,
    Master,
    Serve,
    alter_block,
    assert_differs,
    assert_same_output,
    cached_run,
    load_dump,
    max_diff,
    prompt,
    pyenv,
    pyenv_env,
    recompute,
    run_engine,
    tiny_spec,
    write_tokens,
)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[Master]:
    m = Master(tmp_path)
    yield m
    m.close()


def block_keys(kvctl: str, tokens: list[int]) -> list[str]:
    """The pool key of each full block of tokens for the tiny model's rank 0, from `kvctl hash`."""
    page = 2 * 2 * 2 * TPB * 16 * 4  # K and V of 2 layers, 2 KV heads of 16 floats a token
    out = subprocess.run(
        [
            kvctl,
            "hash",
            "--tokens-file",
            "-",
            "--keys-only",
            "--tokens-per-block",
            str(TPB),
            "--model-key",
            tiny_spec().model_key(),
            "--layer-group",
            "0:%d" % page,
        ],
        input=" ".join(map(str, tokens)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out


def test_two_hosts_one_master(kvctl_bin: str, device: str, master: Master, tmp_path: Path) -> None:
    """§5.2: A on host 1 saves; B, a fresh process on host 2, loads the prefix through the cluster
    and continues exactly as the full recompute. Negative control: one loaded page altered."""
    h1 = Serve(kvctl_bin, tmp_path, "host1", master=master)
    h2 = Serve(kvctl_bin, tmp_path, "host2", master=master)
    try:
        toks = prompt(21)
        a = cached_run(device, h1.socket, toks)
        assert (a.loaded_tokens, a.saved_blocks) == (0, 6)
        keys = block_keys(kvctl_bin, toks)
        assert sorted(keys) == sorted(master.keys()), "the master holds other keys than A's blocks"

        f = write_tokens(tmp_path / "p.json", toks)
        b = run_engine(
            [
                "generate",
                "--socket",
                h2.socket,
                "--tokens-file",
                f,
                "--max-new-tokens",
                "32",
                "--device",
                device,
                "--tokens-per-block",
                str(TPB),
                *TINY,
                "--dump",
                str(tmp_path / "b.pt"),
            ]
        )
        assert b["loaded_tokens"] == 6 * TPB, b
        db = load_dump(str(tmp_path / "b.pt"))
        for blk in range(6):
            assert db["pages"][blk] == a.pages[blk], "block %d: host 2 loaded bytes other than host 1 saved" % blk
        ref = recompute(device, toks)
        assert b["tokens"] == ref.tokens == a.tokens
        assert max_diff(db["logits"], torch.stack(ref.logits)) <= 1e-5

        bad = cached_run(device, h2.socket, toks, after_load=alter_block(5))
        assert bad.loaded_tokens == 6 * TPB
        assert_differs(bad, ref, "host 2, one page altered after its load")
    finally:
        h2.close()
        h1.close()


def test_page_removed_between_lookup_and_load(kvctl_bin: str, device: str, master: Master, tmp_path: Path) -> None:
    """§5.3: a page of the hit is removed from the pool after the lookup offered it and before
    the load: the request is handed back (TakeFailedLoads), restarts, loads what is left of the
    prefix and gives the recompute's output. Negative control: the same restart with a page it
    loaded altered."""
    env = pyenv()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_mc_remove.py")
    h = Serve(kvctl_bin, tmp_path, "host", master=master)
    try:
        toks = prompt(22)
        a = cached_run(device, h.socket, toks)
        assert a.saved_blocks == 6
        keys = block_keys(kvctl_bin, toks)
        ref = recompute(device, toks)
        removed: list[int] = []

        def remove(key_index: int):
            def hook(rid: str, offered: int) -> None:
                if removed:
                    return  # the restart's load goes ahead
                assert offered == 6 * TPB, "the lookup offered %d tokens before the removal" % offered
                p = subprocess.run(
                    [os.path.join(env, "bin", "python"), script, master.metadata, master.rpc, keys[key_index]],
                    capture_output=True,
                    text=True,
                    env=pyenv_env(env),
                    timeout=120,
                )
                assert p.returncode == 0, p.stdout + p.stderr[-3000:]
                assert json.loads(p.stdout.strip().splitlines()[-1])["removed"][keys[key_index]] == 0
                removed.append(key_index)

            return hook

        b = cached_run(device, h.socket, toks, before_load=remove(3))
        assert removed == [3]
        assert b.restarts == 1, "the removed page's load was not handed back"
        assert b.loaded_tokens == 3 * TPB, "after the restart the hit should end before the removed block"
        assert_same_output(b, ref, "restarted after a removed page")
        assert b.pages[3] == a.pages[3], "the recomputed block differs from A's"

        # The restart saved block 3 again; remove it once more and load with one page altered.
        removed.clear()
        bad = cached_run(device, h.socket, toks, before_load=remove(4), after_load=alter_block(1))
        assert bad.restarts == 1 and bad.loaded_tokens == 4 * TPB
        assert_differs(bad, ref, "restarted, one loaded page altered")
    finally:
        h.close()
