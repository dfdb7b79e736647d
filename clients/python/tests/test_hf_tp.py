"""§5.4: the reference engine under tensor parallelism, two rank processes on one kvctl serve.
Each rank holds half of the KV heads (its attention shard; o_proj summed over the ranks) and
registers its own pages; each saves and loads its own shard under its own keys (w2r0, w2r1).

Full recompute: the same two ranks without kvctl, in the same block-sized chunks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from .hf_support import (
    Serve,
    engine_env,
    free_port,
    http_get,
    max_diff,
    prompt,
    recompute,
    write_tokens,
)


def test_two_ranks_save_and_load_their_own_shards(kvctl_bin: str, device: str, tmp_path: Path) -> None:
    serve = Serve(kvctl_bin, tmp_path, "tp")
    try:
        toks = prompt(31)
        f = write_tokens(tmp_path / "p.json", toks)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_tp_rank.py")
        init = "tcp://127.0.0.1:%d" % free_port()
        procs = []
        for r in range(2):
            log = open(tmp_path / ("rank%d.log" % r), "wb")
            procs.append(
                (
                    subprocess.Popen(
                        [
                            sys.executable,
                            script,
                            "--socket",
                            serve.socket,
                            "--rank",
                            str(r),
                            "--dist-init",
                            init,
                            "--tokens-file",
                            f,
                            "--out",
                            str(tmp_path / ("rank%d.pt" % r)),
                            "--device",
                            device,
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=engine_env(),
                    ),
                    log,
                )
            )
        for r, (p, log) in enumerate(procs):
            try:
                rc = p.wait(600)
            finally:
                if p.poll() is None:
                    p.kill()
                log.close()
            assert rc == 0, "rank %d exited %d:\n%s" % (r, rc, (tmp_path / ("rank%d.log" % r)).read_text()[-4000:])
        res = [torch.load(tmp_path / ("rank%d.pt" % r), weights_only=False) for r in range(2)]

        for r in range(2):
            ref, a, b, c = (res[r][k] for k in ("recompute", "a", "b", "c"))
            assert (a["loaded"], a["saved"]) == (0, 6), (r, a["loaded"], a["saved"])
            assert b["loaded"] == 6 * 16, (r, b["loaded"])
            for blk in range(6):
                assert b["pages"][blk] == a["pages"][blk], "rank %d block %d: loaded bytes differ from saved" % (r, blk)
                assert a["pages"][blk] == ref["pages"][blk], "rank %d block %d: saved KV is not the recompute's" % (
                    r,
                    blk,
                )
            assert a["tokens"] == b["tokens"] == ref["tokens"], "rank %d: tokens differ" % r
            assert max_diff(b["logits"], ref["logits"]) <= 1e-5
            # Negative control: rank 0 altered one loaded page of its shard; both ranks see it.
            assert c["loaded"] == 6 * 16
            assert c["tokens"] != ref["tokens"] or max_diff(c["logits"], ref["logits"]) > 1e-5, (
                "rank %d: an altered page gave the recompute's output" % r
            )
        for blk in range(6):
            assert res[0]["a"]["pages"][blk] != res[1]["a"]["pages"][blk], "both ranks saved the same shard"
        assert res[0]["b"]["tokens"] == res[1]["b"]["tokens"]

        # Each rank's shard is in the pool under its own keys.
        code, body = http_get(serve.admin + "/get_all_keys")
        assert code == 200
        keys = body.decode().split()
        for shard in ("/w2r0/", "/w2r1/"):
            assert sum(shard in k for k in keys) == 6, (shard, keys)

        # The sharded model is the same model: its tokens are the single rank's.
        single = recompute(device, toks)
        assert single.tokens == res[0]["recompute"]["tokens"]
        assert max_diff(torch.stack(single.logits), res[0]["recompute"]["logits"]) <= 1e-4
    finally:
        serve.close()
