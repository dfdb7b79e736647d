"""The descriptor side channel: file descriptors handed to the daemon with SCM_RIGHTS.

gRPC cannot carry descriptors, so an engine sends its memory's descriptor (a memfd, a CUDA VMM
export, a call channel's socket) to the side channel at ``fd_socket_path(socket)`` first: one
connection per descriptor, one byte with the descriptor attached, and the daemon answers with a
32-character token that names it in the next request (Register, RegisterPromptArena,
OpenCallChannel). The daemon keeps an unclaimed descriptor for 30 seconds and at most 16 per
process.

A descriptor goes only to a daemon the engine trusts (trust.py): the side channel's directory and
socket, then the listener's SO_PEERCRED uid, are checked before the byte is sent.
"""

from __future__ import annotations

import socket

from .errors import CallTimeout, DaemonUnavailable, KvctlError, ResourceExhausted
from .trust import check_daemon_path, check_daemon_peer

__all__ = ["TOKEN_CHARS", "send_fd"]

# TOKEN_CHARS is the length of a descriptor token: 16 random bytes in hex.
TOKEN_CHARS = 32


def send_fd(fd_socket: str, fd: int, timeout: float = 10.0, *, daemon_uid: int = 0) -> str:
    """Sends a copy of fd over the side channel at fd_socket and returns its token. fd stays
    the caller's. Raises UntrustedDaemon, before anything is sent, when the socket's directory,
    the socket or its listener is not this process's uid, root or daemon_uid (when > 0; see
    trust.py); DaemonUnavailable when nothing listens there, CallTimeout when the exchange does
    not finish within timeout seconds, ResourceExhausted when the daemon holds too many unclaimed
    descriptors, KvctlError for any other refusal."""
    check_daemon_path(fd_socket, daemon_uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout)
        try:
            s.connect(fd_socket)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise DaemonUnavailable(
                "descriptor channel %s: %s: is kvctl serve running on this socket?" % (fd_socket, e.strerror)
            ) from e
        except OSError as e:
            raise DaemonUnavailable("descriptor channel %s: %s" % (fd_socket, e)) from e
        check_daemon_peer(s, fd_socket, daemon_uid)
        try:
            socket.send_fds(s, [b"\0"], [fd])
            reply = s.recv(256)
        except TimeoutError as e:
            raise CallTimeout("descriptor channel %s: no answer within %.3gs" % (fd_socket, timeout)) from e
        except OSError as e:
            raise DaemonUnavailable("descriptor channel %s: %s" % (fd_socket, e)) from e
    finally:
        s.close()
    text = reply.decode("utf-8", "replace")
    if len(text) == TOKEN_CHARS and not text.startswith("error"):
        return text
    if not text:
        raise DaemonUnavailable("descriptor channel %s: closed without an answer" % fd_socket)
    if "unclaimed descriptors" in text:
        raise ResourceExhausted("descriptor channel %s: %s" % (fd_socket, text))
    raise KvctlError("descriptor channel %s: %s" % (fd_socket, text))
