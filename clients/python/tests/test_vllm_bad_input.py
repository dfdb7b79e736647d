"""KvctlConnector on bad input, with vLLM's real config classes and a real kvctl serve: an unset
PYTHONHASHSEED, a daemon that is not there or goes away, a wrong or missing scheduler token, a
scheduler call before vLLM's handshake, settings vLLM cannot give. Each is a Python exception
naming the cause; the daemon stays up."""

from __future__ import annotations

import shutil

import pytest

from .conftest import start_daemon
from .hf_support import require_vllm, tiny_spec

vllm = require_vllm()

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402

import kvctl_engine as kv  # noqa: E402
from kvctl_engine.vllm import KvctlConnector, KvctlHandshakeMetadata  # noqa: E402
from kvctl_engine.vllm import memory as kvmemory  # noqa: E402
from kvctl_engine.vllm.settings import SettingsError  # noqa: E402

from .vllm_cpu_engine import CPUEngine, allocate, vllm_config  # noqa: E402

pytestmark = pytest.mark.vllm


def worker(socket: str, *, hash_algo: str = "sha256", **extra: object) -> tuple[KvctlConnector, object]:
    spec = tiny_spec()
    vc = vllm_config(spec, "bad-input", {"socket": socket, **extra}, hash_algo=hash_algo)
    kvc, shm, views = allocate(vc, spec, 8)
    c = KvctlConnector(vc, KVConnectorRole.WORKER, kvc)
    return c, (vc, kvc, shm, views)


def test_unset_pythonhashseed_is_refused_where_vllm_keys_are_random(daemon, monkeypatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(SettingsError, match="PYTHONHASHSEED is unset: --prefix-caching-hash-algo xxhash"):
        worker(daemon.socket, hash_algo="xxhash")
    # vLLM 0.33 seeds SHA-256 with a fixed string when PYTHONHASHSEED is unset: the connector
    # registers that seed, the one vLLM's own resolve_none_hash_seed gives.
    c, (_, _, shm, _) = worker(daemon.socket)
    try:
        assert c.key_params is not None
        assert c.key_params.python_hash_seed == kv_cache_utils.resolve_none_hash_seed(get_hash_fn_by_name("sha256"))
        assert c.key_params.python_hash_seed == "vllm-none-hash"
    finally:
        kvmemory.release_host_kv_buffer(shm)
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    c, (_, _, shm, _) = worker(daemon.socket, hash_algo="xxhash")
    assert c.key_params is not None and c.key_params.python_hash_seed == "42"
    assert c.settings.format == "vllm-xxhash"
    kvmemory.release_host_kv_buffer(shm)


def test_daemon_not_there(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    sock = str(tmp_path / "none" / "kvctl.sock")
    c, (_, _, shm, views) = worker(sock)
    try:
        with pytest.raises(kv.DaemonUnavailable, match=sock):
            c.register_kv_caches(views)
        with pytest.raises(kv.NotRegistered, match="not registered yet"):
            c.get_handshake_metadata()
    finally:
        kvmemory.release_host_kv_buffer(shm)


def test_daemon_goes_away(kvctl_bin, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    d = start_daemon(kvctl_bin)
    try:
        e = CPUEngine(d.socket, tiny_spec(), extra={"model_key": "gone"})
        e.add("r", list(range(40)), 2)
        d.kill()
        with pytest.raises(kv.DaemonUnavailable):
            e.step()
        e.scheduler.shutdown()
        kvmemory.release_host_kv_buffer(e.shm)
    finally:
        d.kill()
        shutil.rmtree(d.dir, ignore_errors=True)


def test_scheduler_token_refusals(daemon, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    e = CPUEngine(daemon.socket, tiny_spec(), extra={"model_key": "tokens"})
    try:
        good = e.worker.get_handshake_metadata()
        assert isinstance(good, KvctlHandshakeMetadata) and len(good.scheduler_token) == 64
        sched = e.scheduler.connector
        wrong = KvctlHandshakeMetadata(good.engine, "0" * 64, good.socket)
        with pytest.raises(kv.NotOwner, match="wrong scheduler token"):
            sched.set_xfer_handshake_metadata({0: wrong})
        # No worker reported a token (a rank without the scheduler adapter, or another connector's).
        with pytest.raises(kv.FailedPrecondition, match="0 of 1 workers report a kvctl scheduler token"):
            sched.set_xfer_handshake_metadata({0: KvctlHandshakeMetadata(good.engine, "", good.socket)})
        # Before any handshake the scheduler has nothing to call.
        with pytest.raises(kv.FailedPrecondition, match="set_xfer_handshake_metadata"):
            sched.build_connector_meta(e.scheduler.schedule())
        # The right token attaches again, and the engine serves.
        sched.set_xfer_handshake_metadata({0: good})
        e.add("r", list(range(40)), 2)
        assert len(e.run()["r"].tokens) == 2
    finally:
        e.close()
    assert daemon.proc.poll() is None


def test_settings_vllm_cannot_give(daemon, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with pytest.raises(SettingsError, match="unknown key 'sockt' \\(did you mean socket\\?\\)"):
        worker(daemon.socket, sockt="/x")
    with pytest.raises(SettingsError, match="does not derive the keys"):
        worker(daemon.socket, format="vllm-sha256-cbor")
    # A scheme kvctl serve does not know is refused at registration, naming it.
    c, (_, _, shm, views) = worker(daemon.socket, format="nonesuch")
    try:
        with pytest.raises(kv.InvalidArgument, match="nonesuch"):
            c.register_kv_caches(views)
    finally:
        kvmemory.release_host_kv_buffer(shm)
