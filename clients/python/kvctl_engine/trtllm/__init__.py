"""kvctl's KV cache connector for TensorRT-LLM: ``kv_connector_config`` names this module.

In an LLM API YAML (docs/trtllm.md)::

    kv_connector_config:
      connector_module: kvctl_engine.trtllm
      connector_scheduler_class: KvctlConnectorScheduler
      connector_worker_class: KvctlConnectorWorker
      server_url: unix:///run/kvctl/kvctl.sock?model_key=NAME

TensorRT-LLM imports this module and takes the two classes by name: the worker is built on
every rank, the scheduler on rank 0 (on every owner under attention DP). Each rank holds one
connection to ``kvctl serve``; every call maps onto the engine API (the table is in
docs/trtllm.md and docs/ENGINE_API.md).

Modules:

* ``connector``: ``KvctlConnectorScheduler`` and ``KvctlConnectorWorker`` (and the producer
  pair), loaded on first use so that the stand-ins and the driver import without the SDK's
  dependencies.
* ``settings``: the socket and registration settings from ``server_url`` and ``KVCTL_*``.
* ``base``: TensorRT-LLM's base classes when importable, else ``standin``'s.
* ``pinned``: the interface as read from TensorRT-LLM's sources, with file paths and commits.
* ``standin``: stand-ins of the base classes; ``driver``: a stand-in of TensorRT-LLM's
  connector manager, calling a connector in TensorRT-LLM's order.
"""

from __future__ import annotations

_CLASSES = (
    "KvctlConnectorScheduler",
    "KvctlConnectorWorker",
    "KvctlProducerConnectorScheduler",
    "KvctlProducerConnectorWorker",
)

__all__ = list(_CLASSES)


def __getattr__(name: str):
    if name in _CLASSES:
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
