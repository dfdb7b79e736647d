"""Whom an engine hands its memory to: the checks made before any descriptor leaves the process.

A descriptor sent over the side channel (engine memory, a prompt arena, a call channel) gives its
receiver read-write access to the engine's memory. Another local user who created the engine's
socket directory (``/tmp/kvctl-<uid>/`` is predictable) before kvctl serve started, or who listens
on a socket the directory holds, would receive it. So before sending, the SDK checks, with the
same rules as the Go client (core/engineapi/daemontrust.go):

- the socket's directory is not a symlink, is a directory, is owned by a trusted uid, and is not
  writable by group or others (mode & 0o022 == 0);
- the side channel's path is a socket owned by a trusted uid;
- after connecting, the listener's SO_PEERCRED uid is a trusted uid.

The trusted uids are this process's effective uid, root (which can read any process's memory
anyway) and, when given, the uid kvctl serve runs as (a daemon shared with engines of other users
through ``--engine-group``). Anything else raises :class:`~kvctl_engine.errors.UntrustedDaemon`,
whose message says what was planted and by which uid; nothing is sent.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

from .errors import DaemonUnavailable, UntrustedDaemon

__all__ = ["check_daemon_path", "check_daemon_peer", "trusted_uid"]

_REFUSE = "refusing to send this engine's memory there"


def trusted_uid(uid: int, daemon_uid: int = 0) -> bool:
    """Whether uid may own the daemon's socket directory and serve its side channel."""
    return uid == 0 or uid == os.geteuid() or (daemon_uid > 0 and uid == daemon_uid)


def _describe(daemon_uid: int) -> str:
    euid = os.geteuid()
    if daemon_uid > 0 and daemon_uid != euid:
        return "this engine's uid %d or the daemon's uid %d" % (euid, daemon_uid)
    return "this engine's uid %d" % euid


def check_daemon_path(path: str, daemon_uid: int = 0) -> None:
    """Refuses (UntrustedDaemon) a side channel at path whose directory is a symlink, is owned by
    an untrusted uid or can be written by others, or which is not a socket owned by a trusted uid.
    Raises DaemonUnavailable when the directory or socket does not exist."""
    d = os.path.dirname(path) or "."
    try:
        st = os.lstat(d)
    except OSError as e:
        raise DaemonUnavailable("socket directory %s: %s" % (d, e.strerror or e)) from e
    if stat.S_ISLNK(st.st_mode):
        try:
            dest = os.readlink(d)
        except OSError:
            dest = ""
        raise UntrustedDaemon(
            "socket directory %s is a symlink to %r, which another user may have planted; %s" % (d, dest, _REFUSE),
            planted=d,
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedDaemon("socket directory %s is not a directory" % d, planted=d)
    if not trusted_uid(st.st_uid, daemon_uid):
        raise UntrustedDaemon(
            "socket directory %s is owned by uid %d, not by %s: another user planted it; %s (remove it, or "
            "name the daemon's uid if it runs as another user)" % (d, st.st_uid, _describe(daemon_uid), _REFUSE),
            planted=d,
            uid=st.st_uid,
        )
    perm = stat.S_IMODE(st.st_mode) & 0o777
    if perm & 0o022:
        raise UntrustedDaemon(
            "socket directory %s has mode %04o: others can replace its sockets; %s (chmod 700 %s)"
            % (d, perm, _REFUSE, d),
            planted=d,
        )
    try:
        st = os.lstat(path)
    except OSError as e:
        raise DaemonUnavailable(
            "descriptor channel %s: %s: is kvctl serve running on this socket?" % (path, e.strerror or e)
        ) from e
    if not stat.S_ISSOCK(st.st_mode):
        raise UntrustedDaemon(
            "descriptor channel %s is not a socket (mode %s)" % (path, stat.filemode(st.st_mode)), planted=path
        )
    if not trusted_uid(st.st_uid, daemon_uid):
        raise UntrustedDaemon(
            "descriptor channel %s is owned by uid %d, not by %s: another user planted it; %s"
            % (path, st.st_uid, _describe(daemon_uid), _REFUSE),
            planted=path,
            uid=st.st_uid,
        )


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def check_daemon_peer(sock: socket.socket, path: str, daemon_uid: int = 0) -> None:
    """Refuses (UntrustedDaemon) a connected unix socket whose listener's SO_PEERCRED uid is not
    trusted."""
    try:
        pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError as e:
        raise DaemonUnavailable("descriptor channel %s: peer credentials: %s" % (path, e)) from e
    if not trusted_uid(uid, daemon_uid):
        raise UntrustedDaemon(
            "descriptor channel %s is served by pid %d of uid %d, not by %s: another user's process listens "
            "there; refusing to send this engine's memory to it" % (path, pid, uid, _describe(daemon_uid)),
            planted=path,
            uid=uid,
        )
