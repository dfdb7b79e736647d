"""One rank of a tensor-parallel reference engine, for test_hf_tp: run as two processes
(--rank 0 and 1) that meet at --dist-init. Each holds its half of the KV heads and its own pages.

In order, on both ranks: the full recompute (no kvctl), engine A (computes and saves the
prompt), engine B (a fresh registration and pool: loads the prefix), engine C (loads with one
of rank 0's loaded pages altered, the negative control). Writes every run's tokens, logits,
loaded tokens, restarts and page bytes to --out (torch.save).
"""

import argparse
import json
import sys

import torch

from kvctl_engine.hf import Engine, EngineOptions, Hooks, ModelSpec, TorchGroup


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--dist-init", required=True)
    p.add_argument("--tokens-file", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    with open(a.tokens_file) as f:
        tokens = json.load(f)
    spec = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=512, seed=7)
    group = TorchGroup(a.dist_init, 2, a.rank)

    def opts(use_cache, name=""):
        return EngineOptions(
            spec=spec, device=a.device, tokens_per_block=16, slots=32, use_cache=use_cache, socket=a.socket, name=name
        )

    def alter(pool, slots):
        if group.rank == 0:
            pool.alter(slots[2])

    out = {}
    try:
        runs = [
            ("recompute", False, Hooks(keep_pages=True)),
            ("a", True, Hooks(keep_pages=True)),
            ("b", True, Hooks(keep_pages=True)),
            ("c", True, Hooks(after_load=alter)),
        ]
        for name, cached, hooks in runs:
            with Engine(opts(cached, "tp-" + name), group) as e:
                r = e.generate(tokens, 32, hooks, request_id="tp-%s-req" % name)
            out[name] = {
                "tokens": r.tokens,
                "logits": torch.stack(r.logits).cpu(),
                "loaded": r.loaded_tokens,
                "restarts": r.restarts,
                "saved": r.saved_blocks,
                "pages": r.pages,
            }
    finally:
        group.close()
    torch.save(out, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
