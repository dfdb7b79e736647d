"""kvctl_engine.hf: a reference inference engine on Hugging Face transformers over kvctl serve.

A Llama-architecture model with seeded random weights (nothing is downloaded) whose paged KV is
the memory kvctl serve loads into and saves from. For each prompt it looks the prompt up, loads
the hit prefix into its pages, builds a transformers cache from them, computes the rest block by
block, saves the blocks it computed and decodes greedily. Operators run it as a smoke test of a
deployment (``python -m kvctl_engine.hf generate``: the second run of a prompt loads its prefix
and prints the same tokens as ``--no-cache``); the repository's tests use it as the proof that KV
moved through kvctl gives the model's own output.

Modules: model (the model, block-chunked prefill, greedy decoding, tensor-parallel sharding),
pages (the KV pool and its Register layout), engine (the per-prompt call sequence), cli.
Needs torch and transformers (the ``hf`` extra).
"""

from typing import Any

__all__ = ["Engine", "EngineOptions", "Group", "Hooks", "ModelSpec", "Result", "TorchGroup", "build_model"]

_FROM = {
    "Engine": "engine",
    "EngineOptions": "engine",
    "Group": "engine",
    "Hooks": "engine",
    "Result": "engine",
    "TorchGroup": "engine",
    "ModelSpec": "model",
    "build_model": "model",
}


def _need_torch() -> None:
    """Raises ImportError naming the extra that installs PyTorch and transformers."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "kvctl_engine.hf needs PyTorch and transformers (%s): install them with "
            "pip install 'kvctl-engine[hf]' (or './clients/python[hf]' from a checkout)" % e
        ) from e


def __getattr__(name: str) -> Any:
    # The package imports its modules on first use, so that `python -m kvctl_engine.hf` without
    # PyTorch says which extra to install instead of failing inside an import.
    mod = _FROM.get(name)
    if mod is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    _need_torch()
    import importlib

    return getattr(importlib.import_module("." + mod, __name__), name)
