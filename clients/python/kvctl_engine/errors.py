"""The exceptions of the engine SDK: one class per outcome an engine must handle differently.

Every failed call raises a subclass of :class:`KvctlError`. The class is chosen from the gRPC
status code the daemon answered with (the same code over gRPC and over a call channel) and, where
one code covers outcomes that need different handling, from the daemon's message:

================================  ===================  =============================================
class                             daemon code          what the engine does
================================  ===================  =============================================
:class:`DaemonUnavailable`        UNAVAILABLE          the daemon is gone (or shutting down, or never
                                                       listened): its registrations are gone with the
                                                       connection. Reconnect and register again, or
                                                       run without the cache.
:class:`CallTimeout`              DEADLINE_EXCEEDED    the call's deadline passed; whether the daemon
                                                       acted on it is unknown. Treat the connection
                                                       as broken (close, reconnect, register).
:class:`Cancelled`                CANCELLED            the call was cancelled; as CallTimeout.
:class:`LoadFailed`               DATA_LOSS            a load this rank must have failed (a tensor-
                                                       parallel rank lost a page its peers loaded):
                                                       the rank's KV is inconsistent. Fail the
                                                       affected requests on every rank (or the rank).
:class:`RequestMustRestart`       INVALID_ARGUMENT     the request's tokens shrank under the daemon
                                  ("token list         (a preempted request whose prompt changed):
                                  shrank")             RequestReset it and look it up afresh.
:class:`ProtocolViolation`        FAILED_PRECONDITION  fail-stop: the engine broke the call order
                                  ("failed loads not   (did not take its failed loads, or named a
                                  taken", "misreported request id wrongly). The rank refuses
                                  request id")         every later call; unregister it.
:class:`VersionMismatch`          FAILED_PRECONDITION  the daemon does not speak this SDK's major
                                  ("engine API         API version. Use a matching SDK or daemon.
                                  version")
:class:`FailedPrecondition`       FAILED_PRECONDITION  any other call the rank's state does not allow
                                                       (a scheduler call on a worker-only rank, a
                                                       prompt arena missing, engine memory the daemon
                                                       could not open). A bug in the engine.
:class:`InvalidArgument`          INVALID_ARGUMENT     a malformed request, or bad input the SDK
                                                       refused before sending (an unsealed memfd, a
                                                       CUDA IPC handle of the wrong size). A bug.
:class:`ResourceExhausted`        RESOURCE_EXHAUSTED   a daemon limit (engines, live requests, tokens,
                                                       call channels, message size). Finish or reset
                                                       requests, or send less.
:class:`NotRegistered`            NOT_FOUND            the engine name is not registered (it was
                                                       unregistered, or its connection ended).
:class:`AlreadyRegistered`        ALREADY_EXISTS       the engine name is taken; pick another or
                                                       unregister the old one.
:class:`NotOwner`                 PERMISSION_DENIED    the rank was registered over another
                                                       connection; only that one may use it.
:class:`Unimplemented`            UNIMPLEMENTED        the daemon is older and lacks the call.
:class:`InternalError`            INTERNAL, UNKNOWN    a daemon bug; report it with the message.
:class:`UntrustedDaemon`          (none: raised before the socket may not be kvctl serve's: its
                                  anything is sent)    directory or side channel belongs to another
                                                       uid, is writable by others or a symlink, or
                                                       another uid's process listens (trust.py).
                                                       Nothing was sent; remove what was planted, or
                                                       name the daemon's uid.
================================  ===================  =============================================

docs/ENGINE_API.md has the same table with the daemon's side of each.
"""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyRegistered",
    "CallTimeout",
    "Cancelled",
    "DaemonUnavailable",
    "FailedPrecondition",
    "InternalError",
    "InvalidArgument",
    "KvctlError",
    "LoadFailed",
    "NotOwner",
    "NotRegistered",
    "ProtocolViolation",
    "RequestMustRestart",
    "ResourceExhausted",
    "Unimplemented",
    "UntrustedDaemon",
    "VersionMismatch",
    "error_from_status",
]


class KvctlError(Exception):
    """A call to kvctl serve failed.

    ``code`` is the gRPC status code (None for an error the SDK found before any call),
    ``details`` the daemon's message (or the SDK's), ``method`` the engine API method."""

    code: grpc.StatusCode | None = None

    def __init__(self, details: str, *, code: grpc.StatusCode | None = None, method: str = "") -> None:
        self.details = details
        self.method = method
        if code is not None:
            self.code = code
        prefix = method + ": " if method else ""
        super().__init__(prefix + details)


class DaemonUnavailable(KvctlError, ConnectionError):
    """The daemon cannot be reached or went away (UNAVAILABLE): no socket, nothing listening,
    the connection or call channel closed, or the daemon is shutting down. Its registrations
    ended with the connection: reconnect and register again."""

    code = grpc.StatusCode.UNAVAILABLE


class CallTimeout(KvctlError, TimeoutError):
    """The call's deadline passed before the daemon answered (DEADLINE_EXCEEDED). Whether the
    daemon acted on the call is unknown: treat the connection as broken."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(KvctlError):
    """The call was cancelled (CANCELLED)."""

    code = grpc.StatusCode.CANCELLED


class LoadFailed(KvctlError):
    """A load failed on a rank that cannot recompute alone (DATA_LOSS): a tensor-parallel rank
    lost a page its peers loaded. The affected requests must fail on every rank."""

    code = grpc.StatusCode.DATA_LOSS


class InvalidArgument(KvctlError, ValueError):
    """A malformed request (INVALID_ARGUMENT), or bad input the SDK refused before sending it."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class RequestMustRestart(InvalidArgument):
    """The request's tokens shrank under the daemon: RequestReset it and look it up again."""


class FailedPrecondition(KvctlError):
    """The rank's state does not allow the call (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class VersionMismatch(FailedPrecondition):
    """The daemon does not speak this SDK's major engine API version; the message names both."""


class ProtocolViolation(FailedPrecondition):
    """Fail-stop: the engine broke the call protocol (failed loads not taken, a misreported
    request id). The rank refuses every later call; unregister it."""


class ResourceExhausted(KvctlError):
    """A daemon limit was reached (RESOURCE_EXHAUSTED); the message names it."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotRegistered(KvctlError, LookupError):
    """The engine name is not registered (NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyRegistered(KvctlError):
    """The engine name is taken (ALREADY_EXISTS)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class NotOwner(KvctlError, PermissionError):
    """The rank was registered over another connection (PERMISSION_DENIED)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(KvctlError):
    """The daemon lacks the call (UNIMPLEMENTED): it is older than this SDK."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(KvctlError):
    """A daemon bug (INTERNAL or UNKNOWN)."""

    code = grpc.StatusCode.INTERNAL


class UntrustedDaemon(KvctlError, PermissionError):
    """The engine socket may not be kvctl serve's: its directory or side channel is owned by
    another uid, writable by others or a symlink, or its listener (SO_PEERCRED) is another uid's
    process. Raised before anything is sent. ``planted`` is the path found, ``uid`` the owner or
    listener uid when one was untrusted (else None)."""

    def __init__(self, details: str, *, planted: str = "", uid: int | None = None, method: str = "") -> None:
        self.planted = planted
        self.uid = uid
        super().__init__(details, method=method)


_BY_CODE: dict[grpc.StatusCode, type[KvctlError]] = {
    grpc.StatusCode.UNAVAILABLE: DaemonUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: CallTimeout,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.DATA_LOSS: LoadFailed,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.NOT_FOUND: NotRegistered,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyRegistered,
    grpc.StatusCode.PERMISSION_DENIED: NotOwner,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
}

# Markers of the daemon's messages (core/connector, core/keys, core/engineapi/version.go) that
# pick a subclass where one code covers outcomes handled differently.
_FAIL_STOP_MARKERS = ("failed loads not taken", "misreported request id")
_VERSION_MARKER = "engine API version"
_TOKENS_SHRANK_MARKER = "token list shrank"


def error_from_status(code: grpc.StatusCode, details: str, method: str = "") -> KvctlError:
    """The exception of a call that ended with code and details."""
    cls: type[KvctlError] = _BY_CODE.get(code, KvctlError)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if _VERSION_MARKER in details:
            cls = VersionMismatch
        elif any(m in details for m in _FAIL_STOP_MARKERS):
            cls = ProtocolViolation
    elif code == grpc.StatusCode.INVALID_ARGUMENT and _TOKENS_SHRANK_MARKER in details:
        cls = RequestMustRestart
    return cls(details, code=code, method=method)
