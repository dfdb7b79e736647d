"""Fixtures: a real `kvctl serve` process on a real socket, with the embedded pool.

The binary is $KVCTL_BIN when set, else built from this repository with `go build` once per
session. Without Go and without $KVCTL_BIN the daemon tests are skipped, or fail when CI=true.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def kvctl_bin() -> Iterator[str]:
    given = os.environ.get("KVCTL_BIN")
    if given:
        yield given
        return
    go = shutil.which("go")
    if go is None:
        msg = "no kvctl binary: set $KVCTL_BIN or install Go to build it"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    out = tempfile.mkdtemp(prefix="kvsdk-bin-")
    path = os.path.join(out, "kvctl")
    subprocess.run([go, "build", "-o", path, "./cmd/kvctl"], cwd=REPO, check=True)
    yield path
    shutil.rmtree(out, ignore_errors=True)


@dataclass
class Daemon:
    """A running kvctl serve: its process, engine socket and admin URL."""

    proc: subprocess.Popen[bytes]
    socket: str
    admin: str
    dir: str
    log: str

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()


def start_daemon(binary: str, pool_size: str = "256MiB", *extra: str) -> Daemon:
    """Starts kvctl serve in a fresh 0700 directory and waits (at most 60 s) until it is ready."""
    d = tempfile.mkdtemp(prefix="kvsdk-")
    os.chmod(d, 0o700)
    sock = os.path.join(d, "kvctl.sock")
    log = os.path.join(d, "serve.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "serve", "--socket", sock, "--pool-size", pool_size, "--admin-addr", "127.0.0.1:0", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KVCTL_SOCKET": ""},
        )
    deadline = time.monotonic() + 60
    while True:
        with open(log, errors="replace") as f:
            text = f.read()
        if re.search(r"^\s*ready\s*$", text, re.M) and os.path.exists(sock):
            break
        if proc.poll() is not None:
            raise RuntimeError("kvctl serve exited with %s:\n%s" % (proc.returncode, text))
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("kvctl serve was not ready within 60 s:\n%s" % text)
        time.sleep(0.05)
    m = re.search(r"admin\s+(http://\S+)", text)
    return Daemon(proc=proc, socket=sock, admin=m.group(1) if m else "", dir=d, log=log)


@pytest.fixture(scope="session")
def daemon(kvctl_bin: str) -> Iterator[Daemon]:
    """One daemon shared by the tests that do not stop it."""
    d = start_daemon(kvctl_bin)
    yield d
    d.stop()
    shutil.rmtree(d.dir, ignore_errors=True)


@pytest.fixture
def own_daemon(kvctl_bin: str) -> Iterator[Daemon]:
    """A daemon of the test's own, which it may kill."""
    d = start_daemon(kvctl_bin)
    yield d
    d.kill()
    shutil.rmtree(d.dir, ignore_errors=True)
