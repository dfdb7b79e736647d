"""The TensorRT-LLM connector interface as read from its sources, pinned.

TensorRT-LLM cannot be installed where kvctl is tested (PyPI serves a placeholder and it needs
CUDA), so the connector is written against stand-ins (``standin.py``) of the two base classes.
This table is what the stand-ins are checked against (tests/test_trtllm_standin.py), and what
the real classes are checked against wherever ``tensorrt_llm`` is importable. Each entry says
where it was read:

- ``BASE``: ``tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py`` at commit
  035ab91cad04b7b77a479a9526edecfbc742c661 (NVIDIA/TensorRT-LLM), the newest version of the
  file that could be read: per-layer-group callbacks, ``register_kv_cache_layout``,
  ``supports_attention_dp`` and ``SchedulerOutput.attention_dp_rank``.
- ``BASE_OLDER``: the same file at 5a06f334f04fb515ff79f73b7f0f7726ad757361 (and the older
  path ``tensorrt_llm/_torch/pyexecutor/kv_cache_connector.py``): no layer groups, no layout,
  ``RequestData.cache_salt_id`` instead of ``cache_salt``.
- ``SEED``: the hooks and declarations that TensorRT-LLM PR #21195 ("Close the Mooncake store
  feature gap", /work/shared/seed/mooncake-store-pr.txt in kvctl's reference set) adds, with the
  signatures its in-tree mooncake_store connector implements
  (``connectors/mooncake_store/scheduler.py`` stored version 70292456462 and ``worker.py``
  71294481025). They are optional on the real base: a release without the PR lacks them.

A signature is the parameter names in order, each with ``"="`` appended when it has a default.
"""

from __future__ import annotations

SOURCES = {
    "BASE": (
        "tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py",
        "035ab91cad04b7b77a479a9526edecfbc742c661",
    ),
    "BASE_OLDER": (
        "tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py",
        "5a06f334f04fb515ff79f73b7f0f7726ad757361",
    ),
    "SEED": (
        "NVIDIA/TensorRT-LLM pull 21195 (mooncake_store scheduler.py 70292456462, worker.py 71294481025)",
        "draft",
    ),
}

# Module paths a connector's base classes are imported from, newest first.
BASE_MODULES = (
    "tensorrt_llm._torch.pyexecutor.connectors.kv_cache_connector",
    "tensorrt_llm._torch.pyexecutor.kv_cache_connector",
)

SCHEDULER = "KvCacheConnectorScheduler"
WORKER = "KvCacheConnectorWorker"

# Methods of BASE: name -> (signature, abstract).
BASE_METHODS = {
    WORKER: {
        "__init__": (("self", "llm_args"), False),
        "bind_connector_meta": (("self", "metadata"), False),
        "get_connector_meta": (("self",), False),
        "_clear_connector_meta": (("self",), False),
        "register_forward_pass_callable": (("self",), False),
        "register_kv_caches": (("self", "kv_cache_tensor"), True),
        "register_kv_cache_layout": (("self", "layout"), False),
        "start_load_kv": (("self", "stream"), True),
        "wait_for_layer_load": (("self", "layer_idx", "stream"), True),
        "save_kv_layer": (("self", "layer_idx", "stream"), True),
        "wait_for_save": (("self", "stream"), True),
        "get_finished": (("self", "finished_gen_req_ids", "started_loading_req_ids"), True),
    },
    SCHEDULER: {
        "__init__": (("self", "llm_args"), False),
        "build_connector_meta": (("self", "scheduler_output"), True),
        "get_num_new_matched_tokens": (("self", "request", "num_computed_tokens"), True),
        "request_finished": (("self", "request", "cache_block_ids"), True),
        "request_finished_by_layer_group": (("self", "request", "cache_block_ids_by_layer_group"), False),
        "update_state_after_alloc": (("self", "request", "block_ids"), True),
        "update_state_after_alloc_by_layer_group": (("self", "request", "block_ids_by_layer_group"), False),
        "wait_for_initialization": (("self",), False),
    },
}

# Class attributes of BASE with their defaults.
BASE_ATTRIBUTES = {
    WORKER: {"supports_attention_dp": False},
    SCHEDULER: {"supports_attention_dp": False},
}

# Dataclass fields of BASE, in order: name, or name + "=" when it has a default.
BASE_DATACLASSES = {
    "RequestData": (
        "request_id",
        "new_tokens",
        "new_block_ids",
        "computed_position",
        "num_scheduled_tokens",
        "block_hashes=",
        "priorities=",
        "cache_salt=",
        "new_block_ids_by_layer_group=",
    ),
    "SchedulerOutput": ("new_requests=", "cached_requests=", "attention_dp_rank="),
}

# The older interface (BASE_OLDER) differs in these.
BASE_OLDER_DATACLASSES = {
    "RequestData": (
        "request_id",
        "new_tokens",
        "new_block_ids",
        "computed_position",
        "num_scheduled_tokens",
        "priorities=",
        "cache_salt_id=",
    ),
    "SchedulerOutput": ("new_requests=", "cached_requests="),
}

# Optional hooks the seed adds: name -> signature. The manager calls a hook only where the
# connector overrides it (or, for the failed-load trio, where the worker declares
# reports_failed_loads).
SEED_METHODS = {
    SCHEDULER: {
        "cancel_load": ("self", "request", "start", "end"),
        "request_reset": ("self", "request"),
    },
    WORKER: {
        "take_failed_load_requests": ("self",),
        "take_failed_async_load_requests": ("self",),
        "drop_bound_saves": ("self", "request_ids"),
    },
}

# Declarations the seed adds, all False on the base and honoured only when exactly True.
SEED_ATTRIBUTES = {
    SCHEDULER: {"supports_admission_query": False, "supports_speculative_prefill": False},
    WORKER: {
        "reports_failed_loads": False,
        "requires_block_aligned_reuse": False,
        "drops_reuse_match_backoff": False,
        "requires_completion_reservation": False,
        "supports_speculative_prefill": False,
    },
}
