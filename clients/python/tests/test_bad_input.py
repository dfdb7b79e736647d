"""Bad input gives a Python exception that names the cause, never a hang: a missing socket, a
daemon that never answers, a daemon killed mid-call, an unsealed memfd, a CUDA IPC handle of
the wrong size, an API version the daemon does not know."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time

import pytest

import kvctl_engine as kv
from kvctl_engine._pb import engine_pb2 as pb

from .test_lifecycle import LAYERS, PIECE, SLOTS, layout


def test_missing_socket_names_the_path() -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="kvsdk-none-"), "kvctl.sock")
    with pytest.raises(kv.DaemonUnavailable, match=path) as e:
        kv.connect(path)
    assert "kvctl serve" in str(e.value)
    assert isinstance(e.value, ConnectionError)


def test_socket_with_nothing_listening(tmp_path) -> None:
    """A socket file left by a dead daemon: connection refused, over both transports."""
    d = tempfile.mkdtemp(prefix="kvsdk-dead-")
    path = os.path.join(d, "kvctl.sock")
    for p in (path, path + ".fd"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        s.close()  # the file stays, nothing listens
    for channel in (True, False):
        with pytest.raises(kv.DaemonUnavailable, match=path):
            kv.connect(path, timeout=5, call_channel=channel)


class Silent:
    """A unix socket server (engine socket and side channel) that accepts and never answers."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvsdk-silent-")
        self.path = os.path.join(self.dir, "kvctl.sock")
        self.conns: list[socket.socket] = []
        self.listeners = []
        for p in (self.path, self.path + ".fd"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(p)
            s.listen(16)
            self.listeners.append(s)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s: socket.socket) -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self) -> None:
        for s in self.listeners + self.conns:
            s.close()


@pytest.mark.parametrize("call_channel", [True, False])
def test_a_daemon_that_never_answers_times_out(call_channel: bool) -> None:
    srv = Silent()
    try:
        t0 = time.monotonic()
        with pytest.raises(kv.CallTimeout, match="0.5s"):
            kv.connect(srv.path, timeout=0.5, call_channel=call_channel)
        assert time.monotonic() - t0 < 30  # bounded, not a hang (the deadline is what is tested)
    finally:
        srv.close()


def test_a_call_channel_that_never_answers_times_out(daemon) -> None:
    """A call over a channel whose daemon end never answers: the channel's own deadline."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        chan = kv.CallChannel(ours, 64 << 10, 1 << 20)
        with pytest.raises(kv.CallTimeout, match="no response within 0.2s"):
            chan.call(kv.CALL_CHANNEL_METHODS["StartLoad"], b"", 0.2, "StartLoad")
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("call_channel", [True, False])
def test_a_daemon_killed_mid_call(own_daemon, call_channel: bool) -> None:
    client = kv.connect(own_daemon.socket, timeout=10, call_channel=call_channel)
    shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
    rank = kv.Rank.register(client, "killed/rank0", layout(), shm, model_key="killed")
    errors: list[BaseException] = []
    calls = [0]

    def loop() -> None:
        toks = list(range(4096))
        try:
            while True:
                rank.lookup(kv.Request("r%d" % calls[0], toks))
                rank.request_reset("r%d" % calls[0])
                calls[0] += 1
        except BaseException as e:  # noqa: BLE001 - what the loop ended with is the result
            errors.append(e)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    while calls[0] < 20 and th.is_alive():
        time.sleep(0.01)
    own_daemon.kill()
    th.join(30)
    assert not th.is_alive(), "the calls hung after the daemon died"
    assert len(errors) == 1
    assert isinstance(errors[0], kv.DaemonUnavailable), repr(errors[0])
    # And every later call says so too.
    with pytest.raises(kv.DaemonUnavailable):
        rank.take_failed_loads()
    client.close()


def test_an_unsealed_memfd(daemon) -> None:
    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, LAYERS * SLOTS * PIECE)
    try:
        with kv.connect(daemon.socket) as client:
            # Refused by the SDK before it sends anything ...
            with pytest.raises(kv.InvalidArgument, match="not sealed against shrinking"):
                kv.Rank.register(
                    client, "unsealed/rank0", layout(), kv.SharedMemoryFd(fd, LAYERS * SLOTS * PIECE), model_key="m"
                )
            # ... and by the daemon when sent anyway.
            req = pb.RegisterRequest(
                engine="unsealed/rank0",
                model_key="m",
                world_size=1,
                role="both",
                scheduler=True,
                layout=layout().to_pb(),
            )
            req.shared_memory.CopyFrom(pb.SharedMemory(fd_token=client.send_fd(fd), size=LAYERS * SLOTS * PIECE))
            with pytest.raises(kv.InvalidArgument, match="not sealed against shrinking"):
                client.register(req)
            # A memfd smaller than registered.
            small = kv.SharedMemory(4096)
            with pytest.raises(kv.InvalidArgument, match="fewer than the"):
                kv.Rank.register(
                    client, "small/rank0", layout(), kv.SharedMemoryFd(small.fd, LAYERS * SLOTS * PIECE), model_key="m"
                )
    finally:
        os.close(fd)


def test_a_cuda_ipc_handle_of_the_wrong_size(daemon) -> None:
    with pytest.raises(kv.InvalidArgument, match="10 bytes: want 64"):
        kv.CudaIpcMemory(handle=b"x" * 10, offset=0, size=4096, device=0)
    with kv.connect(daemon.socket) as client:
        req = pb.RegisterRequest(
            engine="ipc/rank0", model_key="m", world_size=1, role="both", scheduler=True, layout=layout().to_pb()
        )
        with pytest.raises(kv.InvalidArgument, match="65 bytes"):
            client.register_cuda_ipc(req, b"y" * 65, 0, LAYERS * SLOTS * PIECE, 0)
        # The daemon refuses it too, before it opens any device.
        req.cuda_ipc.CopyFrom(pb.CudaIPC(handle=b"z" * 10, offset=0, size=LAYERS * SLOTS * PIECE, device=0))
        with pytest.raises(kv.InvalidArgument, match="CUDA IPC handle of 10 bytes"):
            client.register(req)


def test_an_unknown_api_version(daemon) -> None:
    with kv.connect(daemon.socket) as client:
        with pytest.raises(kv.VersionMismatch) as e:
            kv.Rank.register(
                client, "v2/rank0", layout(), kv.SharedMemory(LAYERS * SLOTS * PIECE), api_version=(2, 3), model_key="m"
            )
        msg = str(e.value)
        assert "2.3" in msg and "%d.%d" % kv.API_VERSION in msg, msg
        assert e.value.code.name == "FAILED_PRECONDITION"
        # A newer minor version of the same major is accepted.
        r = kv.Rank.register(
            client, "v1.9/rank0", layout(), kv.SharedMemory(LAYERS * SLOTS * PIECE), api_version=(1, 9), model_key="m"
        )
        assert r.daemon_api_version == kv.API_VERSION  # the daemon answers with its own
        r.unregister()
        # An engine that declares no version (written before the field) reads as 1.0.
        shm = kv.SharedMemory(LAYERS * SLOTS * PIECE)
        req = pb.RegisterRequest(
            engine="v-none/rank0", model_key="m", world_size=1, role="both", scheduler=True, layout=layout().to_pb()
        )
        req.shared_memory.CopyFrom(pb.SharedMemory(fd_token=client.send_fd(shm.fd), size=shm.size))
        assert not req.HasField("api_version")
        resp = client.call("Register", req)
        assert (resp.api_version.major, resp.api_version.minor) == kv.API_VERSION
        client.call("Unregister", pb.EngineRef(engine="v-none/rank0"))


def test_a_request_over_the_limits(daemon) -> None:
    with kv.connect(daemon.socket) as client:
        r = kv.Rank.register(client, "limits/rank0", layout(), kv.SharedMemory(LAYERS * SLOTS * PIECE), model_key="m")
        with pytest.raises(kv.InvalidArgument, match="request id length"):
            r.lookup(kv.Request("x" * 100000, [1, 2, 3]))
        with pytest.raises(kv.InvalidArgument, match="outside the registered"):
            r.update_state_after_alloc("nope", [[SLOTS + 5]], 0)
        r.unregister()
