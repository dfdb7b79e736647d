"""server_url and KVCTL_* as the connector reads them, on the vectors the Go checker reads too."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from kvctl_engine.trtllm import settings

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "kvctl-server-url.json"
CASES = json.loads(VECTORS.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["raw"] or "<empty>" for c in CASES])
def test_server_url_vectors(case):
    if "error" in case:
        with pytest.raises(settings.SettingsError, match=case["error"]):
            settings.parse_server_url(case["raw"])
        return
    got = settings.parse_server_url(case["raw"])
    w = case["want"]
    assert (got.socket, got.model_key, got.namespace, got.role, got.async_load, got.async_load_workers) == (
        w["socket"],
        w.get("model_key", ""),
        w.get("namespace", ""),
        w.get("role", ""),
        w.get("async_load", False),
        w.get("async_load_workers", 0),
    )
    assert got.socket_from == "server_url"


def test_resolve_order():
    env = {
        "KVCTL_SOCKET": "/env.sock",
        "KVCTL_MODEL_KEY": "env-model",
        "KVCTL_ROLE": "Producer",
        "KVCTL_NAMESPACE": "ns",
    }
    s = settings.resolve("unix:///url.sock?model_key=url-model", env)
    assert (s.socket, s.socket_from, s.model_key, s.role, s.namespace) == (
        "/url.sock",
        "server_url",
        "url-model",
        "producer",
        "ns",
    )
    s = settings.resolve(None, env)
    assert (s.socket, s.socket_from, s.model_key) == ("/env.sock", "KVCTL_SOCKET", "env-model")
    s = settings.resolve(None, {"KVCTL_MODEL_KEY": "m", "XDG_RUNTIME_DIR": "/run/user/7"})
    assert (s.socket, s.socket_from, s.role) == ("/run/user/7/kvctl/kvctl.sock", "default", "both")
    s = settings.resolve(None, {"KVCTL_MODEL_KEY": "m"})
    assert s.socket.endswith(f"kvctl-{os.getuid()}/kvctl.sock")
    with pytest.raises(settings.SettingsError, match="model_key is required"):
        settings.resolve("/x.sock", {})
    with pytest.raises(settings.SettingsError, match="not an absolute path"):
        settings.resolve(None, {"KVCTL_SOCKET": "rel.sock", "KVCTL_MODEL_KEY": "m"})
    with pytest.raises(settings.SettingsError, match="unknown role"):
        settings.resolve(None, {"KVCTL_ROLE": "leader", "KVCTL_MODEL_KEY": "m"})
