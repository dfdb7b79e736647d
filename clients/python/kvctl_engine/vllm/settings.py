"""The connector's settings: ``kv_connector_extra_config`` of vLLM's ``--kv-transfer-config``.

Every key is optional::

    --kv-transfer-config '{"kv_connector": "KvctlConnector",
                           "kv_connector_module_path": "kvctl_engine.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket": "/run/kvctl/kvctl.sock"}}'

=================== =====================================================================
key                 meaning (default)
=================== =====================================================================
socket              kvctl serve's engine socket, an absolute path ($KVCTL_SOCKET, else
                    kvctl serve's default socket)
format              the key scheme pages are saved under (from vLLM's
                    --prefix-caching-hash-algo: vllm, vllm-sha256-cbor, vllm-xxhash,
                    vllm-xxhash-cbor); ``kvctl hash --help`` lists every scheme
model_key           kvctl's model key (vLLM's --model)
namespace           kvctl's namespace ("")
cache_prefix        the prefix vLLM's MooncakeStoreConnector puts before its keys ("")
engine_name         the registered engine names' prefix; ranks add /rank<R>
                    (vllm/<kv_transfer_config.engine_id>)
async_load          load matched prefixes in the background (false)
async_load_workers  the daemon's load workers for this engine (its default)
daemon_uid          the uid kvctl serve runs as, when not this process's (0: this uid)
timeout             the deadline of a call to kvctl serve, in seconds (30)
save_timeout        how long a preempted request waits for its saves, in seconds (120)
=================== =====================================================================

vLLM's ``kv_role`` picks kvctl's role: kv_both is both, kv_producer producer, kv_consumer
consumer. The vLLM key schemes also take the PYTHONHASHSEED vLLM seeds its block hashes with:
:func:`python_hash_seed` reads it as vLLM does.
"""

from __future__ import annotations

import math
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_SOCKET = "KVCTL_SOCKET"

KEYS = (
    "socket",
    "format",
    "model_key",
    "namespace",
    "cache_prefix",
    "engine_name",
    "async_load",
    "async_load_workers",
    "daemon_uid",
    "timeout",
    "save_timeout",
)

#: vLLM's --prefix-caching-hash-algo and the kvctl key scheme that derives the same keys.
HASH_ALGO_FORMATS = {
    "sha256": "vllm",
    "sha256_cbor": "vllm-sha256-cbor",
    "xxhash": "vllm-xxhash",
    "xxhash_cbor": "vllm-xxhash-cbor",
}

#: vLLM's hash algorithms whose seed must stay secret: with PYTHONHASHSEED unset vLLM seeds them
#: with random bytes per process (vllm.v1.core.kv_cache_utils).
NON_CRYPTO_ALGOS = frozenset({"xxhash", "xxhash_cbor"})

ROLES = {"kv_both": "both", "kv_producer": "producer", "kv_consumer": "consumer"}

# Bounds far above real values: a setting past them is a typo, not a deployment.
MAX_NAME_BYTES = 200  # the daemon takes 256 per engine name; ranks add a suffix
MAX_TIMEOUT_S = 24 * 3600.0
MAX_WORKERS = 1024


class SettingsError(ValueError):
    """kv_connector_extra_config, kv_role or the environment cannot be used."""


@dataclass(frozen=True)
class Settings:
    socket: str
    socket_from: str  # "kv_connector_extra_config", "KVCTL_SOCKET" or "default"
    format: str
    model_key: str
    namespace: str
    cache_prefix: str
    engine_name: str
    role: str
    async_load: bool
    async_load_workers: int
    daemon_uid: int
    timeout: float
    save_timeout: float

    @property
    def vllm_format(self) -> bool:
        """Whether the key scheme is one of vLLM's (key_params go with the registration)."""
        return is_vllm_format(self.format)


def is_vllm_format(fmt: str) -> bool:
    return fmt == "vllm" or fmt.startswith("vllm-")


def _suggest(key: str) -> str:
    best, dist = "", 3
    for k in KEYS:
        prev = list(range(len(k) + 1))
        for i, ca in enumerate(key, 1):
            cur = [i]
            for j, cb in enumerate(k, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
            prev = cur
        if prev[-1] < dist:
            best, dist = k, prev[-1]
    return best


def _str(cfg: Mapping[str, Any], key: str, default: str) -> str:
    v = cfg.get(key, default)
    if not isinstance(v, str):
        raise SettingsError(f"kv_connector_extra_config.{key}: want a string, got {type(v).__name__} {v!r}")
    if len(v.encode()) > MAX_NAME_BYTES * 20:
        raise SettingsError(f"kv_connector_extra_config.{key}: {len(v.encode())} bytes is not a plausible value")
    return v


def _bool(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    v = cfg.get(key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise SettingsError(f"kv_connector_extra_config.{key}: want true or false, got {v!r}")


def _int(cfg: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise SettingsError(f"kv_connector_extra_config.{key}: want an integer, got {v!r}")
    if not lo <= v <= hi:
        raise SettingsError(f"kv_connector_extra_config.{key}: {v} is outside [{lo}, {hi}]")
    return v


def _seconds(cfg: Mapping[str, Any], key: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SettingsError(f"kv_connector_extra_config.{key}: want a number of seconds, got {v!r}")
    if not 0 < v <= MAX_TIMEOUT_S:
        raise SettingsError(f"kv_connector_extra_config.{key}: {v} s is outside (0, {MAX_TIMEOUT_S:.0f}]")
    return float(v)


def default_socket_path(env: Mapping[str, str]) -> str:
    """kvctl serve's default socket (core/engineapi.DefaultSocketPath)."""
    run = env.get("XDG_RUNTIME_DIR")
    if run:
        return posixpath.join(run, "kvctl", "kvctl.sock")
    import tempfile

    return posixpath.join(tempfile.gettempdir(), f"kvctl-{os.getuid()}", "kvctl.sock")


def resolve(
    extra_config: Mapping[str, Any] | None,
    *,
    kv_role: str | None,
    hash_algo: str,
    model: str,
    engine_id: str,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """The settings from kv_connector_extra_config, kv_role, vLLM's hash algorithm and model;
    raises SettingsError naming the key that is wrong."""
    env = os.environ if env is None else env
    cfg = dict(extra_config or {})
    unknown = sorted(k for k in cfg if k not in KEYS)
    if unknown:
        k = unknown[0]
        hint = _suggest(k)
        hint = f" (did you mean {hint}?)" if hint else ""
        raise SettingsError(
            f"kv_connector_extra_config: unknown key {k!r}{hint}; KvctlConnector reads {', '.join(KEYS)}"
        )
    if kv_role not in ROLES:
        raise SettingsError(f"kv_role {kv_role!r}: KvctlConnector takes kv_both, kv_producer or kv_consumer")

    sock = _str(cfg, "socket", "")
    if sock:
        socket_from = "kv_connector_extra_config"
    elif env.get(ENV_SOCKET):
        sock, socket_from = env[ENV_SOCKET], ENV_SOCKET
    else:
        sock, socket_from = default_socket_path(env), "default"
    if not sock.startswith("/"):
        raise SettingsError(
            f"{'kv_connector_extra_config.socket' if socket_from != ENV_SOCKET else ENV_SOCKET} {sock!r} is not an "
            "absolute path (kvctl serve's --socket)"
        )
    sock = posixpath.normpath(sock)

    fmt = _str(cfg, "format", "")
    if not fmt:
        fmt = HASH_ALGO_FORMATS.get(hash_algo, "")
        if not fmt:
            raise SettingsError(
                f"--prefix-caching-hash-algo {hash_algo!r} has no kvctl key scheme "
                f"({', '.join(f'{a}: {f}' for a, f in HASH_ALGO_FORMATS.items())}); "
                "set kv_connector_extra_config.format to choose one"
            )
    elif is_vllm_format(fmt) and fmt != HASH_ALGO_FORMATS.get(hash_algo):
        raise SettingsError(
            f"kv_connector_extra_config.format {fmt!r} does not derive the keys of --prefix-caching-hash-algo "
            f"{hash_algo!r} (that is {HASH_ALGO_FORMATS.get(hash_algo, 'no kvctl scheme')!r}); "
            "the pages would carry keys vLLM never computes"
        )

    model_key = _str(cfg, "model_key", "") or model
    if not model_key:
        raise SettingsError("no model key: vLLM's --model is empty; set kv_connector_extra_config.model_key")
    engine_name = _str(cfg, "engine_name", "") or f"vllm/{engine_id}"
    if len(engine_name.encode()) > MAX_NAME_BYTES:
        raise SettingsError(
            f"kv_connector_extra_config.engine_name: {len(engine_name.encode())} bytes, at most {MAX_NAME_BYTES}"
        )
    return Settings(
        socket=sock,
        socket_from=socket_from,
        format=fmt,
        model_key=model_key,
        namespace=_str(cfg, "namespace", ""),
        cache_prefix=_str(cfg, "cache_prefix", ""),
        engine_name=engine_name,
        role=ROLES[kv_role],
        async_load=_bool(cfg, "async_load", False),
        async_load_workers=_int(cfg, "async_load_workers", 0, 0, MAX_WORKERS),
        daemon_uid=_int(cfg, "daemon_uid", 0, 0, 2**32 - 1),
        timeout=_seconds(cfg, "timeout", 30.0),
        save_timeout=_seconds(cfg, "save_timeout", 120.0),
    )


def python_hash_seed(hash_algo: str, env: Mapping[str, str] | None = None, default_seed: str | None = None) -> str:
    """The string vLLM seeds its block hashes with (NONE_HASH = hash_fn(seed)), read as vLLM reads
    it: PYTHONHASHSEED when set; otherwise, for a cryptographic hash, vLLM's fixed default seed
    (default_seed: ``vllm.v1.core.kv_cache_utils.DEFAULT_NONE_HASH_SEED``, "vllm-none-hash" in
    vLLM 0.33; None for a vLLM without one). Raises SettingsError when vLLM's seed is random per
    process: PYTHONHASHSEED unset with xxhash, or with any hash on a vLLM without a default."""
    env = os.environ if env is None else env
    seed = env.get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    if hash_algo not in NON_CRYPTO_ALGOS and default_seed is not None:
        return default_seed
    why = (
        f"--prefix-caching-hash-algo {hash_algo} is not collision resistant, so"
        if hash_algo in NON_CRYPTO_ALGOS
        else "this vLLM has no fixed default seed, so"
    )
    raise SettingsError(
        f"PYTHONHASHSEED is unset: {why} vLLM seeds its block hashes with random bytes in each process, and "
        "neither kvctl serve nor another engine can derive its keys. Set PYTHONHASHSEED (the same value for every "
        "process of the deployment, e.g. PYTHONHASHSEED=0) before starting vLLM"
    )
