"""python -m kvctl_engine.hf: the reference engine's command line.

generate    one prompt through kvctl serve (or --no-cache), greedy output as JSON or text
bench-ttft  time to first token with a warm pool against --no-cache, per prompt length

Exit codes, as kvctl's: 0 success, 1 failure at run time, 2 usage error, 3 a check that did not
hold (bench-ttft: tokens of the warm run differ from --no-cache), 4 kvctl serve unreachable.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from typing import Any

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_VALIDATION, EXIT_UNREACHABLE = 0, 1, 2, 3, 4

# The most tokens a prompt file may hold: kvctl serve's per-request token limit.
MAX_PROMPT_TOKENS = 1 << 20
# The most bytes read from a tokens file.
MAX_TOKENS_FILE_BYTES = 64 << 20


class UsageError(Exception):
    pass


def parse_tokens(text: str, what: str) -> list[int]:
    """A prompt as kvctl hash --tokens-file reads it: a JSON array of integers, or integers
    separated by whitespace or commas."""
    s = text.strip()
    if s.startswith("["):
        try:
            v = json.loads(s)
        except json.JSONDecodeError as e:
            raise UsageError("%s: not a JSON array of integers: %s" % (what, e)) from None
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise UsageError("%s: a JSON array must hold only integers" % what)
        toks = v
    else:
        toks = []
        for i, f in enumerate(x for x in re.split(r"[\s,]+", s) if x):
            try:
                toks.append(int(f, 10))
            except ValueError:
                raise UsageError("%s: field %d %r is not an integer" % (what, i + 1, f[:32])) from None
    if not toks:
        raise UsageError("%s: no tokens" % what)
    if len(toks) > MAX_PROMPT_TOKENS:
        raise UsageError("%s: %d tokens, more than the limit of %d" % (what, len(toks), MAX_PROMPT_TOKENS))
    return toks


def read_tokens(path: str) -> list[int]:
    if path == "-":
        data = sys.stdin.read(MAX_TOKENS_FILE_BYTES + 1)
        what = "standard input"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                data = f.read(MAX_TOKENS_FILE_BYTES + 1)
        except OSError as e:
            raise UsageError("--tokens-file %s: %s" % (path, e.strerror or e)) from None
        what = path
    if len(data) > MAX_TOKENS_FILE_BYTES:
        raise UsageError("%s: larger than %d bytes" % (what, MAX_TOKENS_FILE_BYTES))
    return parse_tokens(data, what)


def add_model_flags(
    p: argparse.ArgumentParser, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2
) -> None:
    g = p.add_argument_group("model (random weights from --model-seed; nothing is downloaded)")
    g.add_argument("--layers", type=int, default=layers, help="decoder layers (default %(default)s)")
    g.add_argument("--hidden", type=int, default=hidden, help="hidden size (default %(default)s)")
    g.add_argument("--heads", type=int, default=heads, help="attention heads (default %(default)s)")
    g.add_argument("--kv-heads", type=int, default=kv_heads, help="KV heads (default %(default)s)")
    g.add_argument(
        "--vocab",
        type=int,
        default=32000,
        help="vocabulary size; every prompt token must be below it (default %(default)s)",
    )
    g.add_argument("--intermediate", type=int, default=0, help="MLP size (0: 8/3 of --hidden)")
    g.add_argument("--model-seed", type=int, default=0, help="seed of the random weights (default %(default)s)")
    g.add_argument(
        "--init-range",
        type=float,
        default=0.5,
        help="standard deviation of the random weights; transformers' 0.02 makes a random model repeat one token (default %(default)s)",
    )
    g.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="(default %(default)s)"
    )


def add_engine_flags(p: argparse.ArgumentParser, tpb: int = 32) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--socket", default=None, help="kvctl serve's engine socket (default $KVCTL_SOCKET, then serve's default)"
    )
    g.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the model and the KV pages live (default %(default)s)",
    )
    g.add_argument("--tokens-per-block", type=int, default=tpb, help="block size in tokens (default %(default)s)")
    g.add_argument(
        "--chunk-tokens",
        type=int,
        default=0,
        help="prefill chunk, a multiple of the block size (0: one block); runs compared bit for bit need equal chunks",
    )
    g.add_argument("--slots", type=int, default=0, help="KV pages (0: enough for the prompt)")
    g.add_argument("--name", default="", help="engine name registered with kvctl serve (default kvctl-hf-PID)")
    g.add_argument("--namespace", default="", help="key namespace")
    g.add_argument(
        "--model-key",
        default="",
        help="model key (default: derived from the model flags, so different weights never share KV)",
    )
    g.add_argument(
        "--staging-bytes", type=int, default=0, help="pinned staging per direction (0: the daemon's default)"
    )
    g.add_argument(
        "--host-sync",
        action="store_true",
        help="on CUDA, synchronise the device around the daemon's calls instead of ordering them with CUDA events",
    )
    g.add_argument("--world-size", type=int, default=1, help="tensor-parallel ranks, one process each (default 1)")
    g.add_argument("--rank", type=int, default=0, help="this process's tensor-parallel rank")
    g.add_argument(
        "--dist-init", default="", help="torch.distributed init method of the ranks, e.g. tcp://127.0.0.1:29500"
    )


def spec_of(a: argparse.Namespace) -> Any:
    from .model import ModelSpec

    return ModelSpec(
        layers=a.layers,
        hidden=a.hidden,
        heads=a.heads,
        kv_heads=a.kv_heads,
        vocab=a.vocab,
        intermediate=a.intermediate,
        seed=a.model_seed,
        init_range=a.init_range,
        dtype=a.dtype,
    )


def group_of(a: argparse.Namespace) -> Any:
    from .engine import Group, TorchGroup

    if a.world_size < 1 or not 0 <= a.rank < a.world_size:
        raise UsageError("--rank %d of --world-size %d" % (a.rank, a.world_size))
    if a.world_size == 1:
        return Group()
    if not a.dist_init:
        raise UsageError("--world-size %d needs --dist-init" % a.world_size)
    return TorchGroup(a.dist_init, a.world_size, a.rank)


def options_of(a: argparse.Namespace, slots: int, use_cache: bool) -> Any:
    from .engine import EngineOptions

    return EngineOptions(
        spec=spec_of(a),
        device=a.device,
        tokens_per_block=a.tokens_per_block,
        chunk_tokens=a.chunk_tokens,
        slots=a.slots or slots,
        use_cache=use_cache,
        socket=a.socket,
        name=a.name,
        namespace=a.namespace,
        model_key=a.model_key,
        staging_buffer_bytes=a.staging_bytes,
        stream_order=not a.host_sync,
    )


def cmd_generate(a: argparse.Namespace) -> int:
    import torch

    from .engine import Engine, Hooks

    tokens = read_tokens(a.tokens_file)
    if a.max_new_tokens < 1:
        raise UsageError("--max-new-tokens %d: must be positive" % a.max_new_tokens)
    if a.tokens_per_block < 1:
        raise UsageError("--tokens-per-block %d: must be positive" % a.tokens_per_block)
    hooks = Hooks(keep_pages=bool(a.dump))
    if a.alter_loaded_block >= 0:
        b = a.alter_loaded_block

        def alter(pool: Any, slots: list[int]) -> None:
            if b < len(slots):
                pool.alter(slots[b])

        hooks.after_load = alter
    blocks = -(-len(tokens) // a.tokens_per_block)
    group = group_of(a)
    try:
        with Engine(options_of(a, blocks + 1, not a.no_cache), group) as eng:
            res = eng.generate(tokens, a.max_new_tokens, hooks)
    finally:
        group.close()
    if a.dump:
        torch.save({"logits": torch.stack(res.logits).cpu(), "pages": res.pages, "result": res.to_json()}, a.dump)
    out = res.to_json()
    if a.output == "json":
        print(json.dumps(out))
    else:
        print("tokens\t%s" % " ".join(str(t) for t in res.tokens))
        print(
            "loaded_tokens\t%d\ncomputed_tokens\t%d\nttft_seconds\t%.6f\nrestarts\t%d"
            % (res.loaded_tokens, res.computed_tokens, res.ttft_seconds, res.restarts)
        )
    return EXIT_OK


def cmd_bench_ttft(a: argparse.Namespace) -> int:
    import torch

    from .engine import Engine

    try:
        lengths = [int(x) for x in a.prompt_tokens.split(",") if x]
    except ValueError:
        raise UsageError("--prompt-tokens %r: want comma-separated integers" % a.prompt_tokens) from None
    if not lengths or min(lengths) < 2:
        raise UsageError("--prompt-tokens %r: want lengths of at least 2" % a.prompt_tokens)
    if a.reps < 1:
        raise UsageError("--reps %d: must be positive" % a.reps)
    T = a.tokens_per_block
    slots = -(-max(lengths) // T) + 1
    rng = random.Random(a.prompt_seed)
    # Each run gets a prompt of its own first token so that runs never share a prefix by accident.
    group = group_of(a)
    out: dict[str, Any] = {
        "device": a.device,
        "model": vars(spec_of(a)),
        "tokens_per_block": T,
        "chunk_tokens": a.chunk_tokens or T,
        "reps": a.reps,
        "runs": [],
    }
    if a.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    out["torch"] = torch.__version__
    ok = True
    try:
        with Engine(options_of(a, slots, True), group) as eng:
            eng.generate([1] * (2 * T + 1), 1, no_cache=True)  # warm-up of the kernels
            eng.generate([2] * (2 * T + 1), 1)
            for n in lengths:
                prompt = [rng.randrange(a.vocab) for _ in range(n)]
                prompt = group.broadcast(prompt)
                nc, cold, warm = [], None, []
                for _ in range(a.reps):
                    nc.append(eng.generate(prompt, a.max_new_tokens, no_cache=True))
                cold = eng.generate(prompt, a.max_new_tokens)
                for _ in range(a.reps):
                    warm.append(eng.generate(prompt, a.max_new_tokens))
                nct = statistics.median(r.ttft_seconds for r in nc)
                wt = statistics.median(r.ttft_seconds for r in warm)
                match = all(r.tokens == nc[0].tokens for r in warm + [cold])
                ok = ok and match and all(r.loaded_tokens > 0 for r in warm)
                out["runs"].append(
                    {
                        "prompt_tokens": n,
                        "no_cache_ttft_seconds": nct,
                        "cold_ttft_seconds": cold.ttft_seconds,
                        "warm_ttft_seconds": wt,
                        "ttft_ratio_no_cache_over_warm": nct / wt if wt > 0 else None,
                        "warm_loaded_tokens": warm[0].loaded_tokens,
                        "warm_computed_tokens": warm[0].computed_tokens,
                        "warm_load_seconds": statistics.median(r.load_seconds for r in warm),
                        "no_cache_ttft_each": [r.ttft_seconds for r in nc],
                        "warm_ttft_each": [r.ttft_seconds for r in warm],
                        "tokens_match": match,
                    }
                )
    finally:
        group.close()
    out["ok"] = ok
    if group.rank == 0:
        print(json.dumps(out))
    return EXIT_OK if ok else EXIT_VALIDATION


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvctl_engine.hf",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser(
        "generate", help="run one prompt: load its prefix from kvctl serve, compute the rest, save, decode"
    )
    g.add_argument(
        "--tokens-file",
        required=True,
        help="the prompt: a JSON array of token ids, or ids separated by whitespace or commas; - reads stdin",
    )
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens to decode greedily (default %(default)s)")
    g.add_argument("--no-cache", action="store_true", help="compute everything, without kvctl serve")
    g.add_argument("-o", "--output", choices=["json", "table"], default="table")
    g.add_argument(
        "--dump",
        default="",
        help="write the logits of every output token and every full block's page bytes here (torch.save)",
    )
    g.add_argument(
        "--alter-loaded-block",
        type=int,
        default=-1,
        help="negative control: change one value of this loaded block's page before it is used (the output must then differ)",
    )
    add_model_flags(g)
    add_engine_flags(g)
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench-ttft", help="time to first token with a warm pool against --no-cache, as JSON")
    b.add_argument(
        "--prompt-tokens", default="4096,16384", help="prompt lengths, comma-separated (default %(default)s)"
    )
    b.add_argument(
        "--reps",
        type=int,
        default=3,
        help="timed runs per length and mode; the median is reported (default %(default)s)",
    )
    b.add_argument(
        "--max-new-tokens",
        type=int,
        default=4,
        help="tokens decoded per run, compared between modes (default %(default)s)",
    )
    b.add_argument("--prompt-seed", type=int, default=1)
    add_model_flags(b, layers=16, hidden=2048, heads=16, kv_heads=8)
    add_engine_flags(b, tpb=64)
    b.set_defaults(func=cmd_bench_ttft)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    from kvctl_engine.errors import DaemonUnavailable, KvctlError

    try:
        return a.func(a)
    except UsageError as e:
        print("error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:  # bad model or engine settings, bad tokens
        print("error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except DaemonUnavailable as e:
        print("error: kvctl serve unreachable: %s" % e, file=sys.stderr)
        return EXIT_UNREACHABLE
    except KvctlError as e:
        print("error: %s" % e, file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, OSError) as e:
        print("error: %s" % e, file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
