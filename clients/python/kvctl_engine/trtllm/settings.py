"""Where the connector finds ``kvctl serve`` and what it registers with.

``kv_connector_config.server_url`` (a field TensorRT-LLM keeps for connectors that reach a
server) names the socket and, as query parameters, the registration settings::

    unix:///run/kvctl/kvctl.sock?model_key=llama-3.1-8b@r1&namespace=prod&role=both

A bare absolute path works too. What server_url leaves out comes from ``KVCTL_SOCKET``,
``KVCTL_MODEL_KEY``, ``KVCTL_NAMESPACE`` and ``KVCTL_ROLE``, and the socket falls back to
kvctl serve's default path. ``kvctl validate-config`` reads server_url by the same rules
(core/config/llmapi.go; both are tested against testdata/kvctl-server-url.json).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENV_SOCKET = "KVCTL_SOCKET"
ENV_MODEL_KEY = "KVCTL_MODEL_KEY"
ENV_NAMESPACE = "KVCTL_NAMESPACE"
ENV_ROLE = "KVCTL_ROLE"

ROLES = ("both", "producer", "consumer", "capacity")
URL_KEYS = ("model_key", "namespace", "role", "async_load", "async_load_workers")

# Go's strconv.ParseBool, which the Go checker uses.
_BOOLS = {
    "1": True,
    "t": True,
    "T": True,
    "TRUE": True,
    "true": True,
    "True": True,
    "0": False,
    "f": False,
    "F": False,
    "FALSE": False,
    "false": False,
    "False": False,
}

_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class SettingsError(ValueError):
    """server_url or a KVCTL_* variable cannot be used."""


@dataclass
class Settings:
    socket: str = ""  # "" until resolved: kvctl serve's default path
    socket_from: str = ""  # "server_url", "KVCTL_SOCKET" or "default"
    model_key: str = ""
    namespace: str = ""
    role: str = ""
    async_load: bool = False
    async_load_workers: int = 0


def _unquote(raw: str, what: str) -> str:
    if _ESCAPE.search(what):
        raise SettingsError(f"server_url {raw!r}: query: invalid escape in {what!r}")
    from urllib.parse import unquote_plus

    return unquote_plus(what)


def parse_role(value: str) -> str:
    r = value.strip().lower()
    if r not in ROLES:
        raise SettingsError(f"unknown role {value!r}: want both, producer, consumer or capacity")
    return r


def _suggest(key: str) -> str:
    best, dist = "", 3
    for k in URL_KEYS:
        d = _distance(key, k)
        if d < dist:
            best, dist = k, d
    return best


def _distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def parse_server_url(raw: str) -> Settings:
    """Read server_url; raises SettingsError naming what is wrong."""
    if not raw or not raw.strip():
        raise SettingsError("server_url is empty")
    if raw.startswith("/"):
        path, _, query = raw.partition("?")
    elif raw.startswith("unix://"):
        rest = raw[len("unix://") :]
        hostpath, _, query = rest.partition("?")
        if hostpath and not hostpath.startswith("/"):
            host = hostpath.split("/", 1)[0]
            raise SettingsError(f"server_url {raw!r} names host {host!r}; a unix socket URL is unix:///absolute/path")
        path = _unquote(raw, hostpath)
    elif "://" in raw:
        scheme = raw.split("://", 1)[0]
        raise SettingsError(
            f"server_url {raw!r}: kvctl serve's engine API is a unix socket "
            f"(it passes memory handles as descriptors), not {scheme}"
        )
    else:
        raise SettingsError(
            f"server_url {raw!r} is a relative path; the engine's working directory is not kvctl serve's"
        )
    if not path or not path.startswith("/"):
        raise SettingsError(f"server_url {raw!r} names no absolute socket path")
    if posixpath.normpath(path) != path:
        raise SettingsError(f"server_url {raw!r}: the socket path is not clean (want {posixpath.normpath(path)})")
    s = Settings(socket=path, socket_from="server_url")
    seen: dict[str, list[str]] = {}
    for part in query.split("&") if query else []:
        if not part:
            continue
        k, _, v = part.partition("=")
        seen.setdefault(_unquote(raw, k), []).append(_unquote(raw, v))
    for k in sorted(seen):
        vs = seen[k]
        if len(vs) != 1:
            raise SettingsError(f"server_url {raw!r} gives {k} {len(vs)} times")
        v = vs[0]
        if k == "model_key":
            s.model_key = v
        elif k == "namespace":
            s.namespace = v
        elif k == "role":
            try:
                s.role = parse_role(v)
            except SettingsError as e:
                raise SettingsError(f"server_url {raw!r}: {e}") from None
        elif k == "async_load":
            if v not in _BOOLS:
                raise SettingsError(f"server_url {raw!r}: async_load {v!r} is not a boolean")
            s.async_load = _BOOLS[v]
        elif k == "async_load_workers":
            if not re.fullmatch(r"[+-]?[0-9]+", v) or int(v) < 1 or int(v) >= 1 << 31:
                raise SettingsError(f"server_url {raw!r}: async_load_workers {v!r} is not a positive integer")
            s.async_load_workers = int(v)
        else:
            hint = _suggest(k)
            hint = f" (did you mean {hint}?)" if hint else ""
            raise SettingsError(f"server_url {raw!r}: unknown parameter {k!r}{hint}; known: {', '.join(URL_KEYS)}")
    return s


def default_socket_path(getenv: Callable[[str], str | None] = os.environ.get) -> str:
    """kvctl serve's default socket (core/engineapi.DefaultSocketPath)."""
    run = getenv("XDG_RUNTIME_DIR")
    if run:
        return posixpath.join(run, "kvctl", "kvctl.sock")
    import tempfile

    return posixpath.join(tempfile.gettempdir(), f"kvctl-{os.getuid()}", "kvctl.sock")


def resolve(server_url: str | None, env: Mapping[str, str] | None = None) -> Settings:
    """server_url first, then KVCTL_*, then kvctl serve's default socket; model_key is required."""
    env = os.environ if env is None else env
    s = parse_server_url(server_url) if server_url else Settings()
    if not s.socket:
        sock = env.get(ENV_SOCKET, "")
        if sock:
            if not sock.startswith("/"):
                raise SettingsError(f"{ENV_SOCKET}={sock!r} is not an absolute path")
            s.socket, s.socket_from = posixpath.normpath(sock), ENV_SOCKET
        else:
            s.socket, s.socket_from = default_socket_path(env.get), "default"
    s.model_key = s.model_key or env.get(ENV_MODEL_KEY, "")
    if not s.model_key:
        raise SettingsError(
            "model_key is required: every rank registers it with kvctl serve and it has no default; "
            f"add ?model_key=NAME to kv_connector_config.server_url or set {ENV_MODEL_KEY}"
        )
    s.namespace = s.namespace or env.get(ENV_NAMESPACE, "")
    if not s.role:
        s.role = parse_role(env[ENV_ROLE]) if env.get(ENV_ROLE) else "both"
    return s
