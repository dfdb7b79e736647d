"""kvctl_engine.vllm.settings: kv_connector_extra_config, kv_role and vLLM's hash seed, without vLLM
(the module imports none of it)."""

from __future__ import annotations

import pytest

from kvctl_engine.vllm import settings as S

BASE = {"kv_role": "kv_both", "hash_algo": "sha256", "model": "meta-llama/Llama-3.1-8B-Instruct", "engine_id": "e1"}


def resolve(cfg=None, env=None, **kw):
    args = {**BASE, **kw}
    return S.resolve(cfg, env=env or {}, **args)


def test_defaults() -> None:
    s = resolve(env={"XDG_RUNTIME_DIR": "/run/user/7"})
    assert s.socket == "/run/user/7/kvctl/kvctl.sock" and s.socket_from == "default"
    assert s.format == "vllm" and s.vllm_format
    assert s.model_key == BASE["model"]
    assert s.engine_name == "vllm/e1"
    assert s.role == "both"
    assert (s.namespace, s.cache_prefix, s.async_load, s.async_load_workers, s.daemon_uid) == ("", "", False, 0, 0)
    assert (s.timeout, s.save_timeout) == (30.0, 120.0)


def test_socket_order() -> None:
    assert resolve({"socket": "/a/b/../k.sock"}, env={"KVCTL_SOCKET": "/env.sock"}).socket == "/a/k.sock"
    s = resolve(env={"KVCTL_SOCKET": "/env.sock"})
    assert (s.socket, s.socket_from) == ("/env.sock", "KVCTL_SOCKET")
    with pytest.raises(S.SettingsError, match="not an absolute path"):
        resolve({"socket": "kvctl.sock"})
    with pytest.raises(S.SettingsError, match="KVCTL_SOCKET 'rel.sock' is not an absolute path"):
        resolve(env={"KVCTL_SOCKET": "rel.sock"})


@pytest.mark.parametrize(
    "algo,fmt",
    [
        ("sha256", "vllm"),
        ("sha256_cbor", "vllm-sha256-cbor"),
        ("xxhash", "vllm-xxhash"),
        ("xxhash_cbor", "vllm-xxhash-cbor"),
    ],
)
def test_format_follows_the_hash_algo(algo: str, fmt: str) -> None:
    assert resolve(hash_algo=algo).format == fmt
    assert resolve({"format": fmt}, hash_algo=algo).format == fmt


def test_format_refusals() -> None:
    with pytest.raises(S.SettingsError, match="does not derive the keys of --prefix-caching-hash-algo 'sha256'"):
        resolve({"format": "vllm-xxhash"})
    with pytest.raises(S.SettingsError, match="has no kvctl key scheme"):
        resolve(hash_algo="md5")
    # Another engine's scheme is the operator's choice (kvctl keys, not vLLM's).
    s = resolve({"format": "trtllm"})
    assert s.format == "trtllm" and not s.vllm_format


@pytest.mark.parametrize(
    "cfg,msg",
    [
        ({"sockett": "/x"}, "unknown key 'sockett' \\(did you mean socket\\?\\)"),
        ({"async_load": "yes"}, "async_load: want true or false"),
        ({"async_load_workers": -1}, "outside \\[0, 1024\\]"),
        ({"async_load_workers": True}, "want an integer"),
        ({"timeout": 0}, "outside \\(0, 86400\\]"),
        ({"timeout": float("nan")}, "want a number of seconds"),
        ({"model_key": 7}, "model_key: want a string"),
        ({"engine_name": "x" * 300}, "engine_name: 300 bytes, at most 200"),
    ],
)
def test_bad_values_name_the_key(cfg: dict, msg: str) -> None:
    with pytest.raises(S.SettingsError, match=msg):
        resolve(cfg)


def test_roles() -> None:
    assert resolve(kv_role="kv_producer").role == "producer"
    assert resolve(kv_role="kv_consumer").role == "consumer"
    with pytest.raises(S.SettingsError, match="kv_role None"):
        resolve(kv_role=None)
    assert resolve({"async_load": "true"}).async_load is True


def test_python_hash_seed_as_vllm_reads_it() -> None:
    assert S.python_hash_seed("xxhash", {"PYTHONHASHSEED": "0"}) == "0"
    assert S.python_hash_seed("sha256", {"PYTHONHASHSEED": ""}, default_seed="d") == ""
    # vLLM 0.33 seeds the cryptographic hashes with a fixed default when PYTHONHASHSEED is unset.
    assert S.python_hash_seed("sha256", {}, default_seed="vllm-none-hash") == "vllm-none-hash"
    with pytest.raises(S.SettingsError, match="PYTHONHASHSEED is unset: --prefix-caching-hash-algo xxhash"):
        S.python_hash_seed("xxhash", {}, default_seed="vllm-none-hash")
    with pytest.raises(S.SettingsError, match="PYTHONHASHSEED is unset: this vLLM has no fixed default seed"):
        S.python_hash_seed("sha256", {}, default_seed=None)
