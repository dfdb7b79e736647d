"""kvctl's KV connector for vLLM: ``--kv-transfer-config`` names this module.

::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvctlConnector",
        "kv_connector_module_path": "kvctl_engine.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvctl/kvctl.sock"}}'

vLLM imports this module and takes ``KvctlConnector`` by name; it builds it in every worker
(role WORKER: registers the rank's KV memory and moves its pages) and in the engine core (role
SCHEDULER: lookups and each step's metadata, attached to rank 0's scheduler adapter). docs/vllm.md
in the kvctl repository says what it does and what was verified.

Modules:

* ``connector``: ``KvctlConnector`` and its metadata classes, loaded on first use so that the
  settings and memory modules import without vLLM.
* ``settings``: ``kv_connector_extra_config``, the key scheme and vLLM's hash seed.
* ``memory``: vLLM's per-layer KV cache views as kvctl memory and one layer group.
"""

from __future__ import annotations

from typing import Any

_CLASSES = ("KvctlConnector", "KvctlConnectorMetadata", "KvctlHandshakeMetadata", "KvctlWorkerMetadata")

__all__ = list(_CLASSES)


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
