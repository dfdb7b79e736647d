"""Finding kvctl serve's sockets, exactly as the Go client does (core/engineapi/socket.go)."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["SOCKET_ENV", "default_socket_path", "fd_socket_path", "resolve_socket_path"]

# SOCKET_ENV is the variable `kvctl serve` reads its --socket from (every serve flag is also a
# KVCTL_* variable): an engine started in the daemon's environment finds the same path.
SOCKET_ENV = "KVCTL_SOCKET"


def default_socket_path(environ: Mapping[str, str] | None = None) -> str:
    """Where `kvctl serve` listens unless told otherwise: $XDG_RUNTIME_DIR/kvctl/kvctl.sock, else
    <temp dir>/kvctl-<uid>/kvctl.sock, the temp dir being $TMPDIR or /tmp (Go's os.TempDir)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg:
        return os.path.join(xdg, "kvctl", "kvctl.sock")
    tmp = env.get("TMPDIR", "") or "/tmp"
    return os.path.join(tmp, "kvctl-%d" % os.getuid(), "kvctl.sock")


def resolve_socket_path(path: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The engine socket to use: path when given, else $KVCTL_SOCKET, else default_socket_path."""
    if path:
        return path
    env = os.environ if environ is None else environ
    return env.get(SOCKET_ENV, "") or default_socket_path(env)


def fd_socket_path(socket_path: str) -> str:
    """The descriptor side channel that goes with the engine socket at socket_path."""
    return socket_path + ".fd"
