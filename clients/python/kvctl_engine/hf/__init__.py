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

from .engine import Engine, EngineOptions, Group, Hooks, Result, TorchGroup
from .model import ModelSpec, build_model

__all__ = ["Engine", "EngineOptions", "Group", "Hooks", "ModelSpec", "Result", "TorchGroup", "build_model"]
