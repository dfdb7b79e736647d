"""The reference engine's command line (python -m kvctl_engine.hf), run in this process through
cli.main: its JSON contract, prompt files in kvctl hash's formats, exit codes on bad input, and
bench-ttft against a real kvctl serve on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvctl_engine.hf import cli

from .hf_support import TINY, TPB, Serve, prompt, recompute, write_tokens


def run_cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict | None, str]:
    rc = cli.main(args)
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    return rc, (json.loads(lines[-1]) if rc == 0 and lines else None), out.err


@pytest.mark.parametrize(
    "text",
    ["[1, 2, 3]", "1 2 3", "1,2,3\n", " 1 ,\t2\n3 "],
)
def test_tokens_file_formats(text: str) -> None:
    assert cli.parse_tokens(text, "f") == [1, 2, 3]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", "no tokens"),
        ("[1, 2.5]", "only integers"),
        ("[1, true]", "only integers"),
        ("1 2 x", "field 3 'x' is not an integer"),
        ("[1,", "not a JSON array"),
    ],
)
def test_bad_tokens_files(text: str, want: str) -> None:
    with pytest.raises(cli.UsageError, match=want):
        cli.parse_tokens(text, "f")


def test_generate_no_cache_json_contract(capsys: pytest.CaptureFixture[str], device: str, tmp_path: Path) -> None:
    """--no-cache computes everything without a daemon; the JSON fields operators script against
    are there with their types (a contract: add, never rename)."""
    toks = prompt(41)
    f = tmp_path / "p.txt"
    f.write_text(" ".join(map(str, toks)))  # kvctl hash's whitespace format
    rc, out, err = run_cli(
        capsys,
        [
            "generate",
            "--no-cache",
            "--tokens-file",
            str(f),
            "--max-new-tokens",
            "12",
            "--device",
            device,
            "--tokens-per-block",
            str(TPB),
            *TINY,
            "-o",
            "json",
        ],
    )
    assert rc == 0, err
    assert out is not None
    for k, t in [
        ("tokens", list),
        ("loaded_tokens", int),
        ("computed_tokens", int),
        ("ttft_seconds", float),
        ("prompt_tokens", int),
        ("restarts", int),
        ("saved_blocks", int),
    ]:
        assert isinstance(out[k], t), (k, out)
    assert (out["loaded_tokens"], out["computed_tokens"], out["prompt_tokens"]) == (0, len(toks), len(toks))
    assert out["tokens"] == recompute(device, toks, 12).tokens


def test_generate_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = write_tokens(tmp_path / "p.json", prompt(42))
    base = ["generate", "--tokens-file", f, "--tokens-per-block", str(TPB), *TINY]

    rc, _, err = run_cli(capsys, [*base, "--socket", str(tmp_path / "none.sock")])
    assert rc == cli.EXIT_UNREACHABLE and "none.sock" in err, err

    rc, _, err = run_cli(capsys, [*base[:2], str(tmp_path / "missing.json"), *base[3:], "--no-cache"])
    assert rc == cli.EXIT_USAGE and "missing.json" in err, err

    big = write_tokens(tmp_path / "big.json", [1, 2, 600])
    rc, _, err = run_cli(capsys, ["generate", "--tokens-file", big, "--no-cache", *TINY])
    assert rc == cli.EXIT_USAGE and "token 600 at position 2 is outside the vocabulary [0, 512)" in err, err

    rc, _, err = run_cli(capsys, [*base, "--no-cache", "--max-new-tokens", "0"])
    assert rc == cli.EXIT_USAGE and "--max-new-tokens 0" in err, err

    rc, _, err = run_cli(capsys, [*base, "--no-cache", "--chunk-tokens", "24"])
    assert rc == cli.EXIT_USAGE and "multiple of the block size" in err, err

    rc, _, err = run_cli(capsys, ["generate", "--tokens-file", f, "--no-cache", "--layers", "2", "--heads", "3"])
    assert rc == cli.EXIT_USAGE and "multiple of heads 3" in err, err


def test_bench_ttft_on_a_tiny_model(
    capsys: pytest.CaptureFixture[str], kvctl_bin: str, device: str, tmp_path: Path
) -> None:
    """bench-ttft's JSON on a tiny model (the GPU host runs it on a large one): the warm runs load
    all but the last block and give --no-cache's tokens. Timings are reported, not asserted."""
    serve = Serve(kvctl_bin, tmp_path, "bench")
    try:
        rc, out, err = run_cli(
            capsys,
            [
                "bench-ttft",
                "--socket",
                serve.socket,
                "--device",
                device,
                "--prompt-tokens",
                "70,135",
                "--reps",
                "2",
                "--tokens-per-block",
                str(TPB),
                "--chunk-tokens",
                str(2 * TPB),
                *TINY,
            ],
        )
        assert rc == 0, err
        assert out is not None and out["ok"] is True
        assert [r["prompt_tokens"] for r in out["runs"]] == [70, 135]
        for r in out["runs"]:
            assert r["tokens_match"] is True
            assert r["warm_loaded_tokens"] == (r["prompt_tokens"] - 1) // TPB * TPB
            assert r["warm_computed_tokens"] == r["prompt_tokens"] - r["warm_loaded_tokens"]
            assert len(r["no_cache_ttft_each"]) == len(r["warm_ttft_each"]) == 2
            assert r["ttft_ratio_no_cache_over_warm"] > 0
    finally:
        serve.close()


def test_without_torch_the_command_names_the_extra_to_install() -> None:
    """`python -m kvctl_engine.hf` on an SDK installed without the hf extra: a one-line error
    naming the extra and exit 2, not a traceback."""
    code = (
        "import sys, runpy; sys.modules['torch'] = None; sys.argv = ['kvctl_engine.hf', '--help']; "
        "runpy.run_module('kvctl_engine.hf', run_name='__main__')"
    )
    sdk = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": sdk + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "pip install 'kvctl-engine[hf]'" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
