"""The low-level client: one connection to kvctl serve, every engine API call, both transports.

A :class:`Client` is one gRPC connection over the engine socket and, by default, one call
channel of it (callchan.py). ``call(method, request)`` makes any call of the Engine service with a
deadline, over the channel when one is open, free and the request fits its bound, else over gRPC;
errors are the KvctlError subclasses of errors.py whichever transport carried the call.

Registrations belong to the connection that made them: the daemon refuses a rank named over
another connection (NotOwner) and unregisters every rank of a connection that ends. Keep the
Client open for as long as its ranks serve.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from ._pb import engine_pb2 as pb
from ._pb import engine_pb2_grpc as pb_grpc
from .callchan import CallChannel
from .discovery import fd_socket_path, resolve_socket_path
from .errors import DaemonUnavailable, InternalError, InvalidArgument, error_from_status
from .fdpass import send_fd
from .memory import PromptArena, check_sealed
from .trust import check_daemon_path

__all__ = [
    "API_VERSION",
    "MAX_FINISHED_WAIT",
    "CALL_CHANNEL_METHODS",
    "DEFAULT_TIMEOUT",
    "MAX_MESSAGE_BYTES",
    "SLOW_CALL_TIMEOUT",
    "Client",
    "api_version_message",
]

# API_VERSION is the engine API version (major, minor) this SDK speaks; Register declares it.
API_VERSION: tuple[int, int] = (1, 4)
# MAX_MESSAGE_BYTES bounds one message either way, as the daemon does (core/engineapi).
MAX_MESSAGE_BYTES = 64 << 20
# DEFAULT_TIMEOUT is the deadline, in seconds, of a call that names none: no call hangs.
DEFAULT_TIMEOUT = 30.0
# SLOW_CALL_TIMEOUT is the default deadline of the calls that wait for transfers: Unregister
# drains the rank's saves, WaitForSave waits for them.
SLOW_CALL_TIMEOUT = 120.0
_SLOW = frozenset({"Unregister", "WaitForSave"})
# MAX_FINISHED_WAIT is the longest GetFinished may wait for a save or load to finish (seconds;
# GetFinishedRequest.wait_ms at most 1000, core/connector.MaxFinishedWait).
MAX_FINISHED_WAIT = 1.0

# The request and response message of every method.
_METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    m.name: (
        getattr(pb, m.input_type.name),
        getattr(pb, m.output_type.name),
    )
    for m in pb.DESCRIPTOR.services_by_name["Engine"].methods
}


def _channel_numbers() -> dict[str, int]:
    out = {}
    for m in pb.DESCRIPTOR.services_by_name["Engine"].methods:
        snake = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(m.name)).upper()
        v = pb.CallChannelMethod.DESCRIPTOR.values_by_name.get("CALL_CHANNEL_METHOD_" + snake)
        if v is not None and v.number != 0:
            out[m.name] = v.number
    return out


# CALL_CHANNEL_METHODS is each method's CallChannelMethod number (all but OpenCallChannel).
CALL_CHANNEL_METHODS: dict[str, int] = _channel_numbers()


def api_version_message(version: tuple[int, int] = API_VERSION) -> pb.ApiVersion:
    return pb.ApiVersion(major=version[0], minor=version[1])


class Client:
    """One connection to kvctl serve.

    socket_path: the engine socket (default: $KVCTL_SOCKET, else where kvctl serve listens by
    default, discovery.py). timeout: the default deadline of a call in seconds. call_channel:
    open a call channel and make calls over it (one write and one read a call instead of an
    HTTP/2 stream); False keeps every call on gRPC. daemon_uid: the uid kvctl serve runs as when
    it is not this process's (a daemon shared through --engine-group); descriptors go only to a
    socket directory, socket and listener of this process's uid, root or daemon_uid (trust.py).

    Raises DaemonUnavailable when nothing listens on the socket, CallTimeout when the daemon
    accepts but does not answer within timeout, UntrustedDaemon when the call channel's descriptor
    would go to a socket another user planted."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        call_channel: bool = True,
        daemon_uid: int = 0,
    ) -> None:
        path = os.path.abspath(resolve_socket_path(socket_path))
        self.socket_path = path
        self.fd_socket_path = fd_socket_path(path)
        self.timeout = timeout
        self.daemon_uid = daemon_uid
        if not os.path.exists(path):
            raise DaemonUnavailable(
                "no kvctl serve socket at %s: start `kvctl serve`, or pass its --socket (or set $KVCTL_SOCKET)" % path
            )
        self._grpc = grpc.insecure_channel(
            "unix:" + path,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # The daemon unregisters a connection's ranks when it ends; a connection whose
                # calls all go over a call channel looks idle to gRPC, so it must never idle out.
                ("grpc.client_idle_timeout_ms", 2**31 - 1),
                ("grpc.http2.lookahead_bytes", 1 << 20),
                # Each Client its own connection: gRPC otherwise shares one between channels to
                # the same target in a process, and the daemon's ranks belong to a connection.
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        self._stub = pb_grpc.EngineStub(self._grpc)
        self._rpcs: dict[str, Any] = {name: getattr(self._stub, name) for name in _METHODS}
        self._chan: CallChannel | None = None
        self._chan_mu = threading.Lock()
        self._arenas: list[PromptArena] = []
        self._closed = False
        # via is the transport of a call that names none: "auto" (the call channel when open,
        # free and the request fits, else gRPC) or "grpc" (every call over gRPC, the channel
        # kept for calls that ask for it).
        self.via = "auto"
        try:
            if call_channel:
                self.open_call_channel()
            else:
                # One call to find out now whether a daemon answers on the socket.
                self._grpc_call("TakeFailedLoads", pb.EngineRef(engine=""), timeout, probe=True)
        except BaseException:
            self._grpc.close()
            raise

    # -- transports --------------------------------------------------------------------------

    @property
    def call_channel(self) -> CallChannel | None:
        """The open call channel, None when calls go over gRPC only."""
        return self._chan

    def open_call_channel(self, timeout: float | None = None) -> pb.CallChannelResponse:
        """Opens a call channel of this connection; later calls go over it. Returns the daemon's
        bounds (max_frame_bytes, max_message_bytes)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            t = self.timeout if timeout is None else timeout
            token = send_fd(self.fd_socket_path, theirs.fileno(), timeout=t, daemon_uid=self.daemon_uid)
            resp = self._grpc_call("OpenCallChannel", pb.CallChannelRequest(fd_token=token), t)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the daemon holds its own copy now
        chan = CallChannel(ours, resp.max_frame_bytes, resp.max_message_bytes)
        with self._chan_mu:
            old, self._chan = self._chan, chan
        if old is not None:
            old.close()
        return resp

    def _grpc_call(self, method: str, request: Message, timeout: float | None, probe: bool = False) -> Any:
        try:
            return self._rpcs[method](request, timeout=timeout)
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""  # type: ignore[attr-defined]
            if probe and code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return None  # the daemon answered
            if code == grpc.StatusCode.UNAVAILABLE:
                details = "kvctl serve at %s: %s" % (self.socket_path, details)
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                details = "no answer from kvctl serve at %s within %.3gs (%s)" % (
                    self.socket_path,
                    timeout or 0,
                    details,
                )
            raise error_from_status(code, details, method) from None

    def call(self, method: str, request: Message, timeout: float | None = None, via: str | None = None) -> Any:
        """Makes the call method (an Engine service method name, e.g. "Lookup") with request
        (its request message) and returns its response message.

        timeout: the deadline in seconds (default: the client's, SLOW_CALL_TIMEOUT for
        Unregister and WaitForSave). via: "auto" (the call channel when open, free and the
        request fits its bound, else gRPC), "grpc" or "channel" (whatever the size); None takes
        the client's ``via``."""
        if via is None:
            via = self.via
        if self._closed:
            raise DaemonUnavailable("the client is closed", method=method)
        if method not in _METHODS:
            raise InvalidArgument("no engine API method %r" % method)
        if timeout is None:
            timeout = max(self.timeout, SLOW_CALL_TIMEOUT) if method in _SLOW else self.timeout
        chan = self._chan
        number = CALL_CHANNEL_METHODS.get(method)
        if via == "grpc" or chan is None or number is None:
            if via == "channel":
                raise InvalidArgument("%s: no call channel is open, or the method has none" % method)
            return self._grpc_call(method, request, timeout)
        body = request.SerializeToString()
        if via == "auto" and len(body) > chan.max_message:
            # A request larger than the channel takes (a prompt of over half a million tokens).
            return self._grpc_call(method, request, timeout)
        if not self._chan_mu.acquire(blocking=via == "channel"):
            return self._grpc_call(method, request, timeout)  # another thread's call holds it
        try:
            raw = chan.call(number, body, timeout, method)
        finally:
            self._chan_mu.release()
        try:
            return _METHODS[method][1].FromString(raw)
        except DecodeError as e:
            raise InternalError("call channel: the %s response does not decode: %s" % (method, e), method=method) from e

    # -- descriptors and memory --------------------------------------------------------------

    def send_fd(self, fd: int, timeout: float | None = None) -> str:
        """Sends a copy of fd over the descriptor side channel, to a daemon this client trusts
        (UntrustedDaemon otherwise); returns its token."""
        t = self.timeout if timeout is None else timeout
        return send_fd(self.fd_socket_path, fd, timeout=t, daemon_uid=self.daemon_uid)

    def register(self, request: pb.RegisterRequest, timeout: float | None = None) -> pb.RegisterResponse:
        """Register as sent: the request's memory must already be set (see the register_*
        helpers). Declares API_VERSION when the request declares none."""
        if not request.HasField("api_version"):
            request.api_version.CopyFrom(api_version_message())
        return self.call("Register", request, timeout)

    def register_shared_memory(
        self, request: pb.RegisterRequest, fd: int, size: int, timeout: float | None = None
    ) -> pb.RegisterResponse:
        """Registers with fd, a memfd sealed with F_SEAL_SHRINK of at least size bytes, as the
        rank's KV memory. The seal and size are checked here first (InvalidArgument)."""
        check_sealed(fd, size)
        token = self.send_fd(fd, timeout)
        request.shared_memory.CopyFrom(pb.SharedMemory(fd_token=token, size=size))
        return self.register(request, timeout)

    def register_cuda_fd(
        self, request: pb.RegisterRequest, fd: int, size: int, device: int, timeout: float | None = None
    ) -> pb.RegisterResponse:
        """Registers with fd, a CUDA VMM allocation exported as a POSIX descriptor (cuda.py)."""
        if size <= 0:
            raise InvalidArgument("CUDA memory: size must be positive, got %d" % size)
        token = self.send_fd(fd, timeout)
        request.cuda_fd.CopyFrom(pb.CudaFD(fd_token=token, size=size, device=device))
        return self.register(request, timeout)

    def register_cuda_ipc(
        self,
        request: pb.RegisterRequest,
        handle: bytes,
        offset: int,
        size: int,
        device: int,
        timeout: float | None = None,
    ) -> pb.RegisterResponse:
        """Registers with a legacy CUDA IPC handle (64 bytes, or PyTorch's 66) of an allocation,
        the KV memory being size bytes from offset in it (cuda.py makes handles)."""
        from .cuda import check_ipc_handle

        check_ipc_handle(handle)
        if size <= 0 or offset < 0:
            raise InvalidArgument("CUDA IPC memory: offset %d and size %d" % (offset, size))
        # The handle opens this memory for whoever receives it, as a descriptor would: the same
        # checks, on the engine socket, when no call channel (whose peer was checked) carries it.
        check_daemon_path(self.socket_path, self.daemon_uid)
        request.cuda_ipc.CopyFrom(pb.CudaIPC(handle=bytes(handle), offset=offset, size=size, device=device))
        return self.register(request, timeout)

    def attach_scheduler(
        self, engine: str, scheduler_token: str, timeout: float | None = None
    ) -> pb.AttachSchedulerResponse:
        """AttachScheduler: this connection may make the scheduler calls of engine, a rank another
        connection of this uid registered with scheduler = true, whose RegisterResponse returned
        scheduler_token (rank.SchedulerRank is the handle over it)."""
        return self.call(
            "AttachScheduler", pb.AttachSchedulerRequest(engine=engine, scheduler_token=scheduler_token), timeout
        )

    def register_prompt_arena(self, engine: str, arena: PromptArena, timeout: float | None = None) -> None:
        """Hands arena to the daemon as the prompt arena of engine (a scheduler rank of this
        connection). The client closes the arena when it closes."""
        token = self.send_fd(arena.fd, timeout)
        self.call("RegisterPromptArena", pb.PromptArenaRequest(engine=engine, fd_token=token, size=arena.size), timeout)
        self._arenas.append(arena)

    # -- life --------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the call channel and the connection (the daemon then unregisters this
        connection's ranks) and the prompt arenas registered over it."""
        if self._closed:
            return
        self._closed = True
        with self._chan_mu:
            chan, self._chan = self._chan, None
        if chan is not None:
            chan.close()
        self._grpc.close()
        for a in self._arenas:
            a.close()
        self._arenas.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
