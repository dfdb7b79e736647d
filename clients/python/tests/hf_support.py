"""Real components for the reference engine's tests: the kvctl binary (built once a session), a
`kvctl serve` process on a real socket (embedded pool, or a host of a Mooncake cluster), the real
mooncake_master from the shared Python environment (KVCTL_PYENV), and the engine's command line
in processes of its own. Nothing here is a stand-in: every test talks to the real daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

PKG_ROOT = Path(__file__).resolve().parents[1]  # clients/python
REPO = PKG_ROOT.parents[1]

# The tiny model of the CPU suite: a whole prompt runs in well under a second on one core.
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--model-seed", "7"]
TPB = 16


def tiny_spec() -> Any:
    from kvctl_engine.hf.model import ModelSpec

    return ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=512, seed=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_ci() -> bool:
    return os.environ.get("CI", "") == "true"


def unavailable(why: str) -> None:
    """Skips, or fails under CI=true, where CI must have what the test needs."""
    if in_ci():
        pytest.fail(why)
    pytest.skip(why)


def require_vllm() -> Any:
    """vLLM, imported: a module of vLLM tests calls it first. Without vLLM the module is skipped,
    or fails where vLLM must be there (make pytest-vllm sets KVCTL_NEED_VLLM)."""
    try:
        import vllm
    except ImportError as e:
        why = "vLLM does not import (%s): run these tests in the environment `make vllmenv` builds" % e
        if os.environ.get("KVCTL_NEED_VLLM"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why, allow_module_level=True)
    return vllm


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def pyenv() -> str:
    env = os.environ.get("KVCTL_PYENV") or os.environ.get("PYENV") or ""
    if not env or not os.path.exists(os.path.join(env, "bin", "mooncake_master")):
        unavailable("no Mooncake environment: set KVCTL_PYENV to the directory `make pyenv` builds")
    return env


def pyenv_env(env: str) -> dict[str, str]:
    e = dict(os.environ)
    lib = os.path.join(env, "syslib", "lib")
    if os.path.isdir(lib):
        e["LD_LIBRARY_PATH"] = lib + (":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    return e


class Process:
    """A child process whose output goes to a log file, killed at close."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.log_path = name, log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Master:
    """The real mooncake_master on free loopback ports: RPC, HTTP metadata and admin."""

    def __init__(self, tmp: Path) -> None:
        env = pyenv()
        last = ""
        for _ in range(3):
            p = [free_port() for _ in range(3)]
            self.rpc = "127.0.0.1:%d" % p[0]
            self.metadata = "http://127.0.0.1:%d/metadata" % p[1]
            self.admin = "http://127.0.0.1:%d" % p[2]
            self.proc = Process(
                "mooncake_master",
                [
                    os.path.join(env, "bin", "mooncake_master"),
                    "--rpc_address=127.0.0.1",
                    "--rpc_port=%d" % p[0],
                    "--enable_http_metadata_server=true",
                    "--http_metadata_server_host=127.0.0.1",
                    "--http_metadata_server_port=%d" % p[1],
                    "--metrics_host=127.0.0.1",
                    "--metrics_port=%d" % p[2],
                    "--rpc_thread_num=2",
                ],
                tmp / ("master-%d.log" % p[0]),
                env=pyenv_env(env),
            )
            if self._ready(30):
                return
            last = self.proc.log()
            self.proc.close()
        pytest.fail("mooncake_master did not start:\n" + last)

    def _ready(self, limit: float) -> bool:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if not self.proc.alive():
                return False
            try:
                if http_get(self.admin + "/health", 1)[0] == 200 and http_get(self.metadata + "?key=probe", 1)[0] in (
                    200,
                    404,
                ):
                    with socket.create_connection(self.rpc.split(":"), 1):
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def keys(self) -> list[str]:
        code, body = http_get(self.admin + "/get_all_keys")
        assert code == 200, body
        return [k for k in body.decode().split("\n") if k]

    def close(self) -> None:
        self.proc.close()


class Serve:
    """`kvctl serve` on a socket in a private directory, ready before the constructor returns."""

    def __init__(
        self,
        kvctl: str,
        tmp: Path,
        name: str,
        pool_size: str = "64MiB",
        master: Master | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.kvctl, self.name = kvctl, name
        self.dir = Path(tempfile.mkdtemp(prefix="kvhf", dir="/tmp"))  # short: a socket path is at most 107 bytes
        os.chmod(self.dir, 0o700)
        self.socket = str(self.dir / "s.sock")
        port = free_port()
        self.admin = "http://127.0.0.1:%d" % port
        args = [
            kvctl,
            "serve",
            "--socket",
            self.socket,
            "--admin-addr",
            "127.0.0.1:%d" % port,
            "--pool-size",
            pool_size,
            "--staging-buffer-bytes",
            "8MiB",
        ]
        if master is not None:
            args += [
                "--pool-backend",
                "mooncake",
                "--master",
                master.rpc,
                "--metadata",
                master.metadata,
                "--master-admin",
                master.admin,
                "--transfer-port",
                str(free_port()),
                "--host-address",
                "127.0.0.1",
                "--pool-timeout",
                "5s",
            ]
        args += extra or []
        env = dict(os.environ, XDG_CONFIG_HOME=str(self.dir), NO_COLOR="1")
        self.proc = Process("kvctl serve " + name, args, tmp / ("serve-%s.log" % name), env=env)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if not self.proc.alive():
                pytest.fail("kvctl serve %s exited:\n%s" % (name, self.proc.log()))
            try:
                if os.path.exists(self.socket) and http_get(self.admin + "/readyz", 1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        pytest.fail("kvctl serve %s not ready after 60s:\n%s" % (name, self.proc.log()))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict[str, Any]:
        code, body = http_get(self.admin + "/v1/stats")
        assert code == 200, body
        return json.loads(body)

    def close(self) -> None:
        self.proc.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def engine_env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(PKG_ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def run_engine(args: list[str], timeout: float = 600) -> dict[str, Any]:
    """`python -m kvctl_engine.hf ARGS -o json` in a process of its own; its JSON output."""
    cmd = [sys.executable, "-m", "kvctl_engine.hf", *args, "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=engine_env(), timeout=timeout)
    if p.returncode != 0:
        pytest.fail("%s exited %d:\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr[-4000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_tokens(path: Path, tokens: list[int]) -> str:
    path.write_text(json.dumps(tokens))
    return str(path)


def load_dump(path: str) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=False)


def max_diff(a: Any, b: Any) -> float:
    import torch

    a, b = torch.as_tensor(a).float().cpu(), torch.as_tensor(b).float().cpu()
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def prompt(seed: int, blocks: int = 6, tail: int = 5) -> list[int]:
    """An ordinary prompt of the tiny model: blocks full blocks and a partial one."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(blocks * TPB + tail)]


def engine_options(device: str, socket: str | None, **kw: Any) -> Any:
    from kvctl_engine.hf import EngineOptions

    return EngineOptions(
        spec=tiny_spec(),
        device=device,
        tokens_per_block=TPB,
        slots=32,
        use_cache=socket is not None,
        socket=socket,
        **kw,
    )


def recompute(device: str, tokens: list[int], n: int = 32) -> Any:
    """The full recompute every run is compared with: no kvctl, the same block-sized chunks."""
    from kvctl_engine.hf import Engine, Hooks

    with Engine(engine_options(device, None)) as e:
        return e.generate(tokens, n, Hooks(keep_pages=True))


def cached_run(device: str, socket: str, tokens: list[int], n: int = 32, **hook_kw: Any) -> Any:
    """One prompt through a fresh in-process engine (a new registration and a new pool)."""
    from kvctl_engine.hf import Engine, Hooks

    with Engine(engine_options(device, socket)) as e:
        return e.generate(tokens, n, Hooks(keep_pages=True, **hook_kw))


def alter_block(b: int) -> Any:
    def alter(pool: Any, slots: list[int]) -> None:
        assert b < len(slots), "the negative control needs block %d loaded, %d were" % (b, len(slots))
        pool.alter(slots[b])

    return alter


def assert_same_output(got: Any, want: Any, what: str) -> None:
    """Tokens equal and every step's logits within 1e-5 (fp32)."""
    assert got.tokens == want.tokens, "%s: tokens differ from the full recompute" % what
    import torch

    d = max_diff(torch.stack(got.logits), torch.stack(want.logits))
    assert d <= 1e-5, "%s: logits differ from the full recompute by %g" % (what, d)


def assert_differs(got: Any, want: Any, what: str) -> None:
    """The negative control: wrong KV must show in the tokens or the logits."""
    import torch

    if got.tokens != want.tokens:
        return
    d = max_diff(torch.stack(got.logits), torch.stack(want.logits))
    assert d > 1e-5, (
        "%s: an altered page gave the recompute's output (logits within %g): the check cannot see wrong KV" % (what, d)
    )
