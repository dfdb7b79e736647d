"""The connector base classes: TensorRT-LLM's where it is importable, the stand-ins otherwise.

TensorRT-LLM checks nothing about a connector's base class (it imports the module and takes the
two classes by name), but its executor reads the declarations and optional hooks as class
attributes, and ``__init_subclass__`` of the real base fills in the flat callbacks, so the
connector derives from the real classes whenever they exist. ``SOURCE`` names what was loaded:
the module path, or ``"stand-in"``.

A TensorRT-LLM that is installed but fails to import (a CUDA library missing, say) is not
papered over with the stand-ins: only a missing ``tensorrt_llm`` module selects them.
"""

from __future__ import annotations

import importlib

from . import pinned


def _load():
    for path in pinned.BASE_MODULES:
        try:
            mod = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name is not None and (e.name == "tensorrt_llm" or path.startswith(e.name + ".") or e.name == path):
                continue
            raise
        return (mod.KvCacheConnectorScheduler, mod.KvCacheConnectorWorker, mod.SchedulerOutput, mod.RequestData, path)
    from . import standin

    return (
        standin.KvCacheConnectorScheduler,
        standin.KvCacheConnectorWorker,
        standin.SchedulerOutput,
        standin.RequestData,
        "stand-in",
    )


KvCacheConnectorScheduler, KvCacheConnectorWorker, SchedulerOutput, RequestData, SOURCE = _load()

#: True when the stand-ins were loaded.
STANDIN = SOURCE == "stand-in"


def has_seed_hooks() -> bool:
    """Whether the loaded worker base knows the seed's failed-load protocol (take_failed_load_requests).

    Without it TensorRT-LLM never asks for a failed load, so a page lost between lookup and load
    must fail the step instead of restarting the request.
    """
    return hasattr(KvCacheConnectorWorker, "take_failed_load_requests") or STANDIN
