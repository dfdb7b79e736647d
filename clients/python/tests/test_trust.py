"""An engine never hands its memory to a socket another user planted (trust.py).

The same attacks as the Go client's (core/engineapi/daemontrust_test.go and
tests/adversarial/client_test.go): a socket directory writable by others or a symlink, a path
that is not a socket, a directory another user created before the daemon started, a listener of
another uid, and a real kvctl serve running as another user, trusted only when the engine names
its uid. The cross-user cases run as two real users: the engine is root, the other user nobody
(65534), started with subprocess's user/group as the Go tests use SysProcAttr.Credential.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

import kvctl_engine as kv
from kvctl_engine._pb import engine_pb2 as pb
from kvctl_engine.fdpass import send_fd

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second uid (nobody)")


class Listener:
    """A unix listener that takes descriptors and answers with a token, as a planted daemon
    would; got counts the descriptors that reached it."""

    def __init__(self, path: str) -> None:
        self.got = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                try:
                    _, fds, _, _ = socket.recv_fds(c, 1, 4)
                except OSError:
                    continue
                for fd in fds:
                    self.got += 1
                    os.close(fd)
                c.sendall(b"ab" * 16)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kvtr-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_refuses_unsafe_sockets(base: str) -> None:
    """A directory writable by others, a symlinked directory and a path that is not a socket are
    refused with UntrustedDaemon naming what was found; no descriptor reaches a listener."""
    open_dir = os.path.join(base, "open")
    os.mkdir(open_dir)
    os.chmod(open_dir, 0o777)
    safe = os.path.join(base, "safe")
    os.mkdir(safe, 0o700)
    link = os.path.join(base, "link")
    os.symlink(safe, link)
    listeners = [Listener(os.path.join(open_dir, "s.fd")), Listener(os.path.join(safe, "s.fd"))]
    with open(os.path.join(safe, "file.fd"), "w"):
        pass
    fd = os.memfd_create("trust", os.MFD_CLOEXEC)
    try:
        cases = [
            (os.path.join(open_dir, "s.fd"), "has mode 0777"),
            (os.path.join(link, "s.fd"), "is a symlink"),
            (os.path.join(safe, "file.fd"), "is not a socket"),
        ]
        for path, want in cases:
            with pytest.raises(kv.UntrustedDaemon, match=want) as ei:
                send_fd(path, fd, timeout=5)
            assert ei.value.planted, "the error does not carry what was planted"
        # The checks pass for the engine's own safe socket: the descriptor arrives.
        assert len(send_fd(os.path.join(safe, "s.fd"), fd, timeout=5)) == 32
    finally:
        os.close(fd)
        for ln in listeners:
            ln.close()
    assert listeners[0].got == 0, "a descriptor reached the socket in a world-writable directory"
    assert listeners[1].got == 1


# The planted daemon, run as nobody: it listens where the engine expects kvctl serve (creating
# $DIR first when set, or on the bound sockets it inherited as $FDS), takes every descriptor sent
# to it and answers with a token, as the real daemon would. It prints "ready", then "received"
# per descriptor.
PLANT = r"""
import os, socket, sys, threading, time
ls = []
if os.environ.get("DIR"):
    os.mkdir(os.environ["DIR"], 0o700)
if os.environ.get("SOCKET"):
    for p in (os.environ["SOCKET"], os.environ["SOCKET"] + ".fd"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        ls.append(s)
else:
    ls = [socket.socket(fileno=int(f)) for f in os.environ["FDS"].split(",")]
def handle(c):
    try:
        _, fds, _, _ = socket.recv_fds(c, 1, 4)
    except OSError:
        return
    if fds:
        print("received", flush=True)
        c.sendall(b"ab" * 16)
    time.sleep(120)
def serve(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()
for s in ls:
    s.listen(16)  # before "ready": a connect right after it must not be refused
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
time.sleep(120)
"""


# A Python the other user can run: the test's own may live under root's home.
OTHER_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), sys.executable)


class Plant:
    def __init__(self, env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [OTHER_PYTHON, "-c", PLANT],
            cwd="/",
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            pass_fds=pass_fds,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            _, err = self.proc.communicate()
            raise RuntimeError("planting: %r\n%s" % (line, err))

    def received(self) -> int:
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=30)
        return out.count("received")


@needs_root
def test_planted_directory(base: str) -> None:
    """Another user created the engine's socket directory (in a shared sticky /tmp-like parent)
    and listens there before kvctl serve starts: connecting refuses before anything is sent,
    naming the planter's uid."""
    os.chmod(base, 0o1777)
    d = os.path.join(base, "kvctl-%d" % os.getuid())
    sock = os.path.join(d, "kvctl.sock")
    plant = Plant({"DIR": d, "SOCKET": sock})
    try:
        with pytest.raises(kv.UntrustedDaemon, match="owned by uid 65534") as ei:
            kv.connect(sock, timeout=10)
        assert "planted" in str(ei.value) and ei.value.uid == NOBODY and ei.value.planted == d
        shm = kv.SharedMemory(1 << 20)
        try:
            with pytest.raises(kv.UntrustedDaemon):
                send_fd(sock + ".fd", shm.fd, timeout=10)
        finally:
            shm.close()
    finally:
        n = plant.received()
    assert n == 0, "the planted daemon received %d of the engine's descriptors" % n


@needs_root
def test_listener_of_another_uid(base: str) -> None:
    """The directory is the engine's own and safe, but another user's process listens on its
    sockets (it got hold of the bound sockets): SO_PEERCRED names that uid and nothing is sent."""
    os.chmod(base, 0o700)
    sock = os.path.join(base, "kvctl.sock")
    bound = []
    for p in (sock, sock + ".fd"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        bound.append(s)
    fds = tuple(s.fileno() for s in bound)
    plant = Plant({"FDS": ",".join(str(f) for f in fds)}, pass_fds=fds)
    try:
        for s in bound:
            s.close()
        with pytest.raises(kv.UntrustedDaemon, match="of uid 65534") as ei:
            kv.connect(sock, timeout=10)
        assert "another user's process" in str(ei.value) and ei.value.uid == NOBODY
    finally:
        n = plant.received()
    assert n == 0, "the other uid's listener received %d of the engine's descriptors" % n


@pytest.fixture
def nobody_daemon(kvctl_bin: str) -> Iterator[str]:
    """A real kvctl serve running as nobody, in a directory nobody owns and root's group may
    enter (--engine-group 0); yields its engine socket."""
    bindir = tempfile.mkdtemp(prefix="kvtr-bin-")
    os.chmod(bindir, 0o755)
    binary = os.path.join(bindir, "kvctl")
    shutil.copy(kvctl_bin, binary)
    os.chmod(binary, 0o755)
    d = tempfile.mkdtemp(prefix="kvtr-")
    os.chown(d, NOBODY, 0)
    os.chmod(d, 0o2750)  # setgid: the sockets take the directory's group
    sock = os.path.join(d, "kvctl.sock")
    log = os.path.join(bindir, "serve.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "serve", "--socket", sock, "--pool-size", "64MiB", "--admin-addr", "127.0.0.1:0"]
            + ["--engine-group", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            env={**os.environ, "KVCTL_SOCKET": "", "HOME": "/tmp", "XDG_CONFIG_HOME": "/tmp/kvtr-no-config"},
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with open(log, errors="replace") as f:
                text = f.read()
            if re.search(r"^\s*ready\s*$", text, re.M) and os.path.exists(sock + ".fd"):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("kvctl serve as nobody did not start:\n%s" % text)
            time.sleep(0.05)
        yield sock
    finally:
        proc.kill()
        proc.wait(timeout=30)
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(bindir, ignore_errors=True)


@needs_root
def test_daemon_of_another_uid(nobody_daemon: str) -> None:
    """A real daemon of another uid is refused unless the engine names that uid; named, the
    engine's call channel and memory reach it and calls work."""
    with pytest.raises(kv.UntrustedDaemon, match="owned by uid 65534"):
        kv.connect(nobody_daemon, timeout=10)
    with kv.connect(nobody_daemon, timeout=10, daemon_uid=NOBODY) as client:
        assert client.call_channel is not None
        shm = kv.SharedMemory(1 << 20)
        try:
            assert len(client.send_fd(shm.fd)) == 32
        finally:
            shm.close()
        with pytest.raises(kv.NotRegistered):
            client.call("TakeFailedLoads", pb.EngineRef(engine="nobody-here"))
