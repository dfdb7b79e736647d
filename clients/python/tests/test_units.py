"""The SDK's parts that need no daemon: socket discovery, the error mapping, packed tokens, sealed
memory and prompt arenas, call-channel framing against a scripted peer, and the CUDA paths with
stand-in libraries (the stand-ins replace libcudart and libcuda only; the code around the driver
calls is the SDK's own)."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import tempfile
import threading

import grpc
import pytest

import kvctl_engine as kv
from kvctl_engine import cuda
from kvctl_engine.callchan import FRAME_HEADER, FRAME_MAGIC, FRAME_MORE
from kvctl_engine.errors import error_from_status
from kvctl_engine.memory import F_GET_SEALS, F_SEAL_GROW, F_SEAL_SHRINK

# -- discovery -------------------------------------------------------------------------------


def test_default_socket_path_follows_the_go_client() -> None:
    uid = os.getuid()
    assert kv.default_socket_path({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/kvctl/kvctl.sock"
    assert kv.default_socket_path({}) == "/tmp/kvctl-%d/kvctl.sock" % uid
    assert kv.default_socket_path({"TMPDIR": "/scratch"}) == "/scratch/kvctl-%d/kvctl.sock" % uid
    assert kv.default_socket_path({"XDG_RUNTIME_DIR": "", "TMPDIR": ""}) == "/tmp/kvctl-%d/kvctl.sock" % uid
    assert kv.fd_socket_path("/a/kvctl.sock") == "/a/kvctl.sock.fd"


def test_resolve_socket_path_order() -> None:
    env = {"KVCTL_SOCKET": "/env/k.sock", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert kv.resolve_socket_path("/given.sock", env) == "/given.sock"
    assert kv.resolve_socket_path(None, env) == "/env/k.sock"
    assert kv.resolve_socket_path(None, {"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/kvctl/kvctl.sock"


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,details,cls",
    [
        (grpc.StatusCode.UNAVAILABLE, "kvctl serve is shutting down", kv.DaemonUnavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", kv.CallTimeout),
        (grpc.StatusCode.CANCELLED, "cancelled", kv.Cancelled),
        (grpc.StatusCode.DATA_LOSS, "load failed: rank 1 lost 3 pages", kv.LoadFailed),
        (grpc.StatusCode.INVALID_ARGUMENT, "lookup: bad", kv.InvalidArgument),
        (grpc.StatusCode.INVALID_ARGUMENT, "lookup: token list shrank: 10 < 12", kv.RequestMustRestart),
        (grpc.StatusCode.FAILED_PRECONDITION, "engine x registered without the scheduler", kv.FailedPrecondition),
        (grpc.StatusCode.FAILED_PRECONDITION, "register: engine API version 2.0 is not supported", kv.VersionMismatch),
        (grpc.StatusCode.FAILED_PRECONDITION, "failed loads not taken: 2 requests", kv.ProtocolViolation),
        (grpc.StatusCode.FAILED_PRECONDITION, "misreported request id: x", kv.ProtocolViolation),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "live requests, the limit", kv.ResourceExhausted),
        (grpc.StatusCode.NOT_FOUND, 'engine "x" is not registered', kv.NotRegistered),
        (grpc.StatusCode.ALREADY_EXISTS, "already registered", kv.AlreadyRegistered),
        (grpc.StatusCode.PERMISSION_DENIED, "another connection", kv.NotOwner),
        (grpc.StatusCode.UNIMPLEMENTED, "unknown method", kv.Unimplemented),
        (grpc.StatusCode.INTERNAL, "bug", kv.InternalError),
        (grpc.StatusCode.UNKNOWN, "bug", kv.InternalError),
    ],
)
def test_error_mapping(code: grpc.StatusCode, details: str, cls: type) -> None:
    e = error_from_status(code, details, "Lookup")
    assert type(e) is cls
    assert e.code == code and e.details == details and e.method == "Lookup"
    assert str(e) == "Lookup: " + details


def test_error_classes_are_python_families() -> None:
    assert issubclass(kv.CallTimeout, TimeoutError)
    assert issubclass(kv.DaemonUnavailable, ConnectionError)
    assert issubclass(kv.InvalidArgument, ValueError)
    assert issubclass(kv.RequestMustRestart, kv.InvalidArgument)
    assert issubclass(kv.VersionMismatch, kv.FailedPrecondition)


# -- tokens ----------------------------------------------------------------------------------


def test_pack_tokens() -> None:
    toks = [0, 1, -1, 2**63 - 1, -(2**63), 151_000]
    packed = kv.pack_tokens(toks)
    assert len(packed) == 8 * len(toks)
    assert packed[8:16] == struct.pack("<q", 1) and packed[16:24] == b"\xff" * 8
    assert kv.unpack_tokens(packed) == toks
    with pytest.raises(kv.InvalidArgument, match="int64"):
        kv.pack_tokens([2**63])
    with pytest.raises(kv.InvalidArgument, match="not a multiple of 8"):
        kv.unpack_tokens(b"123")


# -- memory ----------------------------------------------------------------------------------


def test_shared_memory_is_sealed_as_the_daemon_requires() -> None:
    with kv.SharedMemory(3 * 4096) as shm:
        seals = fcntl.fcntl(shm.fd, F_GET_SEALS)
        assert seals & F_SEAL_SHRINK and seals & F_SEAL_GROW
        assert os.fstat(shm.fd).st_size == 3 * 4096
        shm.buf[0:4] = b"abcd"
        assert os.pread(shm.fd, 4, 0) == b"abcd"
        with pytest.raises(OSError):
            os.ftruncate(shm.fd, 4096)
        kv.check_sealed(shm.fd, 3 * 4096)
        with pytest.raises(kv.InvalidArgument, match="fewer than the"):
            kv.check_sealed(shm.fd, 4 * 4096)


def test_check_sealed_names_the_problem() -> None:
    with tempfile.TemporaryFile() as f:
        with pytest.raises(kv.InvalidArgument, match="cannot carry seals"):
            kv.check_sealed(f.fileno(), 1)
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(kv.InvalidArgument, match="not sealed against shrinking"):
            kv.check_sealed(fd, 4096)
    finally:
        os.close(fd)
    with pytest.raises(kv.InvalidArgument, match="size must be positive"):
        kv.SharedMemory(0)


def test_prompt_arena_allocates_first_fit() -> None:
    a = kv.PromptArena(8192)
    try:
        assert a.size == 8192
        x = a.alloc(4000)
        y = a.alloc(4000)
        assert (x, y) == (0, 4000)
        assert a.alloc(1000) is None  # 192 bytes left
        a.free(x)
        assert a.alloc(3000) == 0
        assert a.held_bytes() == 7000
        a.write(4000, kv.pack_tokens([5, 6]))
        assert os.pread(a.fd, 16, 4000) == kv.pack_tokens([5, 6])
        assert a.alloc(0) is None and a.alloc(9000) is None
    finally:
        a.close()


# -- call channel framing ----------------------------------------------------------------------


def _frame(method: int, flags: int, status: int, cid: int, body: bytes) -> bytes:
    return FRAME_HEADER.pack(FRAME_MAGIC, method, flags, status, cid) + body


class Peer:
    """The daemon's end of a channel, answering each request with the frames script gives."""

    def __init__(self, script) -> None:  # type: ignore[no-untyped-def]
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.requests: list[bytes] = []
        self.script = script
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                req = self.theirs.recv(1 << 20)
            except OSError:
                return
            if not req:
                return
            self.requests.append(req)
            magic, method, flags, _, cid = FRAME_HEADER.unpack_from(req)
            if flags & FRAME_MORE:
                continue
            for f in self.script(method, cid):
                self.theirs.send(f)

    def close(self) -> None:
        self.ours.close()
        self.theirs.close()


def test_call_channel_assembles_frames_and_maps_errors() -> None:
    def script(method: int, cid: int) -> list[bytes]:
        if cid == 1:  # a response in three frames
            return [
                _frame(method, FRAME_MORE, 0, 1, b"ab"),
                _frame(method, FRAME_MORE, 0, 1, b"cd"),
                _frame(method, 0, 0, 1, b"ef"),
            ]
        if cid == 2:
            return [_frame(method, 0, grpc.StatusCode.NOT_FOUND.value[0], 2, b'engine "x" is not registered')]
        return [b"\x00" * 16]  # bad magic

    peer = Peer(script)
    try:
        chan = kv.CallChannel(peer.ours, 64, 1 << 20)
        assert chan.call(3, b"x" * 100, 5.0, "Lookup") == b"abcdef"
        # 100 bytes in frames of 48: three frames, the first two marked MORE.
        assert [FRAME_HEADER.unpack_from(r)[2] for r in peer.requests] == [FRAME_MORE, FRAME_MORE, 0]
        assert chan.stats.multi_frame_requests == 1 and chan.stats.multi_frame_responses == 1
        with pytest.raises(kv.NotRegistered, match="not registered"):
            chan.call(14, b"", 5.0, "TakeFailedLoads")
        with pytest.raises(kv.DaemonUnavailable, match="magic"):
            chan.call(14, b"", 5.0, "TakeFailedLoads")
        with pytest.raises(kv.DaemonUnavailable, match="magic"):  # broken for good, with the cause
            chan.call(14, b"", 5.0, "TakeFailedLoads")
    finally:
        peer.close()


def test_call_channel_skips_a_late_response() -> None:
    def script(method: int, cid: int) -> list[bytes]:
        if cid == 1:
            return []  # never answered in time
        return [_frame(14, 0, 0, 1, b"late"), _frame(method, 0, 0, cid, b"now")]

    peer = Peer(script)
    try:
        chan = kv.CallChannel(peer.ours, 64 << 10, 1 << 20)
        with pytest.raises(kv.CallTimeout):
            chan.call(14, b"", 0.05, "TakeFailedLoads")
        assert chan.call(11, b"", 5.0, "StartLoad") == b"now"
    finally:
        peer.close()


def test_call_channel_closed_by_the_daemon() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    chan = kv.CallChannel(ours, 64 << 10, 1 << 20)
    with pytest.raises(kv.DaemonUnavailable, match="closed by the daemon"):
        chan.call(14, b"", 1.0, "TakeFailedLoads")
    ours.close()
    with pytest.raises(kv.KvctlError, match="out of range"):
        kv.CallChannel(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET), 8, 1)


# -- CUDA, with stand-ins for libcudart and libcuda -------------------------------------------


class StandInRuntime:
    """Stands in for libcudart/libcuda in ipc_handle_from_pointer: one allocation at base."""

    def __init__(self, base: int, length: int, handle: bytes = b"h" * 64) -> None:
        self.base, self.length, self.handle = base, length, handle
        self.asked: list[int] = []

    def ipc_get_mem_handle(self, ptr: int) -> bytes:
        self.asked.append(ptr)
        return self.handle

    def address_range(self, ptr: int) -> tuple[int, int]:
        assert self.base <= ptr < self.base + self.length
        return self.base, self.length

    def pointer_device(self, ptr: int) -> int:
        return 3


def test_ipc_handle_from_pointer() -> None:
    lib = StandInRuntime(0x7000_0000, 1 << 20)
    m = cuda.ipc_handle_from_pointer(0x7000_0000 + 4096, 8192, lib)
    assert m == kv.CudaIpcMemory(handle=b"h" * 64, offset=4096, size=8192, device=3)
    assert lib.asked == [0x7000_0000]  # the handle names the allocation's base
    with pytest.raises(kv.InvalidArgument, match="run past the end"):
        cuda.ipc_handle_from_pointer(0x7000_0000 + 4096, 1 << 20, lib)
    with pytest.raises(cuda.CudaError, match="gave 63 bytes"):
        cuda.ipc_handle_from_pointer(0x7000_0000, 16, StandInRuntime(0x7000_0000, 64, b"h" * 63))
    with pytest.raises(kv.InvalidArgument):
        cuda.ipc_handle_from_pointer(0, 16, lib)


def test_ipc_handle_sizes() -> None:
    kv.CudaIpcMemory(handle=b"x" * 64, offset=0, size=1, device=0)
    kv.CudaIpcMemory(handle=b"x" * 66, offset=0, size=1, device=0)
    for n in (0, 63, 65, 67):
        with pytest.raises(kv.InvalidArgument, match="%d bytes" % n):
            kv.CudaIpcMemory(handle=b"x" * n, offset=0, size=1, device=0)


class StandInDriver:
    """Stands in for libcuda's VMM calls; records them. fail names a call that fails."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.fd = -1

    def _do(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise cuda.CudaError("%s: CUDA error 2: out of memory" % name)

    def granularity(self, device: int) -> int:
        self._do("granularity")
        return 2 << 20

    def create(self, size: int, device: int) -> int:
        self._do("create")
        return 0xABC

    def export_fd(self, handle: int) -> int:
        self._do("export_fd")
        self.fd = os.memfd_create("stand-in-export")
        return self.fd

    def reserve(self, size: int, alignment: int) -> int:
        self._do("reserve")
        return 0x1_0000_0000

    def map(self, ptr: int, size: int, handle: int) -> None:
        self._do("map")

    def set_access(self, ptr: int, size: int, device: int) -> None:
        self._do("set_access")

    def unmap(self, ptr: int, size: int) -> None:
        self._do("unmap")

    def free_address(self, ptr: int, size: int) -> None:
        self._do("free_address")

    def release(self, handle: int) -> None:
        self._do("release")


def test_vmm_allocation_calls_the_driver_in_order() -> None:
    drv = StandInDriver()
    a = kv.VmmAllocation(3 << 20, device=1, lib=drv)
    assert a.size == 4 << 20  # rounded up to the granularity
    assert (a.ptr, a.handle, a.device) == (0x1_0000_0000, 0xABC, 1)
    assert drv.calls == ["granularity", "create", "export_fd", "reserve", "map", "set_access"]
    mem = kv.CudaFdMemory(a.fd, a.size, a.device)
    assert mem.fd == drv.fd
    a.close()
    assert drv.calls[-3:] == ["unmap", "free_address", "release"]
    with pytest.raises(OSError):
        os.fstat(drv.fd)  # the exported descriptor is closed


def test_vmm_allocation_cleans_up_after_a_failure() -> None:
    drv = StandInDriver(fail="map")
    with pytest.raises(cuda.CudaError, match="cuMemMap|map: CUDA error"):
        kv.VmmAllocation(1, lib=drv)
    assert drv.calls[-3:] == ["unmap", "free_address", "release"]
    with pytest.raises(OSError):
        os.fstat(drv.fd)


def test_real_cuda_libraries_or_a_clear_error() -> None:
    try:
        rt = cuda.CudaRuntime()
    except cuda.CudaError as e:
        assert "cannot load the CUDA" in str(e)
        return
    assert rt.rt is not None and rt.drv is not None


def test_ipc_handle_from_a_cpu_tensor_is_refused() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(kv.InvalidArgument, match="not a CUDA device"):
        kv.ipc_handle_from_tensor(torch.zeros(4))


def test_the_sdk_declares_the_api_version_the_go_side_speaks() -> None:
    """kvctl_engine.API_VERSION is core/engineapi's APIVersionMajor.APIVersionMinor."""
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[3] / "core" / "engineapi" / "version.go").read_text()
    major = int(re.search(r"APIVersionMajor\s*=\s*(\d+)", src).group(1))
    minor = int(re.search(r"APIVersionMinor\s*=\s*(\d+)", src).group(1))
    assert kv.API_VERSION == (major, minor)
