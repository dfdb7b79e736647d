"""Stand-ins of TensorRT-LLM's KV cache connector base classes.

These are written here, not taken from TensorRT-LLM: the method names, parameters, abstract
methods, class-attribute declarations and dataclass fields are those pinned in ``pinned.py``
(``tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py`` at 035ab91c, plus the
optional hooks of the seed PR), and tests/test_trtllm_standin.py checks them against that table
and, where ``tensorrt_llm`` is importable, against the real classes. Behaviour is kept to what
a connector can observe: the metadata slot, the single-group fold of the per-layer-group
callbacks, and a per-layer-group override standing in for the abstract flat form.

The seed's optional hooks (cancel_load, request_reset, take_failed_load_requests, ...) are
defined as no-ops so that the stand-in driver can tell an override from the default, as the
seed's manager does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Marks these classes as stand-ins wherever they are used (base.SOURCE says which were loaded).
IS_STANDIN = True

#: Page index of a block that has no page in a layer group.
BAD_PAGE_INDEX = -1


@dataclass
class RequestData:
    """One scheduled request in a SchedulerOutput: what changed since the connector last saw it."""

    request_id: int
    new_tokens: list[int]
    new_block_ids: list[int]
    computed_position: int
    num_scheduled_tokens: int
    block_hashes: list[int] = field(default_factory=list)
    priorities: list[int] | None = None
    cache_salt: str | None = None
    new_block_ids_by_layer_group: list[list[int]] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """The requests of one scheduler step: first appearances and those seen before."""

    new_requests: list[RequestData] = field(default_factory=list)
    cached_requests: list[RequestData] = field(default_factory=list)
    attention_dp_rank: int | None = None


def _per_group_stands_in(cls: type, base: type, pairs: dict) -> None:
    # A subclass that overrides only the per-layer-group spelling of a callback still has the
    # flat spelling abstract; give it a flat form that refuses, as the real base does, so the
    # class can be built.
    for flat, grouped in pairs.items():
        if getattr(cls, grouped, None) is getattr(base, grouped):
            continue
        if not getattr(getattr(cls, flat, None), "__isabstractmethod__", False):
            continue

        def refuse(self, *args, _flat=flat, _grouped=grouped, **kwargs):
            raise NotImplementedError(f"{type(self).__name__} implements {_grouped}, not {_flat}")

        refuse.__name__ = refuse.__qualname__ = flat
        setattr(cls, flat, refuse)


class KvCacheConnectorWorker(ABC):
    """Stand-in of the worker half: built on every rank."""

    supports_attention_dp: bool = False
    # Seed declarations (False on the base; only an explicit True counts).
    reports_failed_loads: bool = False
    requires_block_aligned_reuse: bool = False
    drops_reuse_match_backoff: bool = False
    requires_completion_reservation: bool = False
    supports_speculative_prefill: bool = False

    def __init__(self, llm_args):
        self._llm_args = llm_args
        self._metadata = None
        super().__init__()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _per_group_stands_in(cls, KvCacheConnectorWorker, {"register_kv_caches": "register_kv_cache_layout"})

    def bind_connector_meta(self, metadata):
        self._metadata = metadata

    def get_connector_meta(self):
        return self._metadata

    def _clear_connector_meta(self):
        self._metadata = None

    def register_forward_pass_callable(self) -> Callable | None:
        return None

    @abstractmethod
    def register_kv_caches(self, kv_cache_tensor):
        """V1: the whole KV pool as one tensor."""

    def register_kv_cache_layout(self, layout) -> None:
        """V2: the pools as a layout; the default hands a single-pool cache to register_kv_caches."""
        tensor = layout.as_single_pool_tensor()
        if tensor is None:
            raise NotImplementedError(f"{type(self).__name__} does not implement register_kv_cache_layout")
        self.register_kv_caches(tensor)

    @abstractmethod
    def start_load_kv(self, stream):
        """Start the loads the bound metadata names, before the forward pass."""

    @abstractmethod
    def wait_for_layer_load(self, layer_idx, stream):
        """Before a layer's work is enqueued."""

    @abstractmethod
    def save_kv_layer(self, layer_idx, stream):
        """After a layer's work is enqueued."""

    @abstractmethod
    def wait_for_save(self, stream):
        """At the end of the forward pass."""

    @abstractmethod
    def get_finished(self, finished_gen_req_ids, started_loading_req_ids) -> tuple[list[int], list[int]]:
        """Ids that finished saving and loading, each only after it was passed in."""

    # Seed hooks (optional; the manager polls them only for a worker declaring reports_failed_loads).
    def take_failed_load_requests(self):
        return set()

    def take_failed_async_load_requests(self):
        return set()

    def drop_bound_saves(self, request_ids):
        return None


class KvCacheConnectorScheduler(ABC):
    """Stand-in of the scheduler half: rank 0 under tensor parallelism, every attention-DP owner."""

    supports_attention_dp: bool = False
    # Seed declarations.
    supports_admission_query: bool = False
    supports_speculative_prefill: bool = False

    def __init__(self, llm_args):
        self._llm_args = llm_args
        super().__init__()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _per_group_stands_in(
            cls,
            KvCacheConnectorScheduler,
            {
                "request_finished": "request_finished_by_layer_group",
                "update_state_after_alloc": "update_state_after_alloc_by_layer_group",
            },
        )

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        """The step's metadata for every worker; it must pickle."""

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens) -> tuple[int, bool]:
        """(tokens the connector can load past num_computed_tokens, whether asynchronously)."""

    @abstractmethod
    def request_finished(self, request, cache_block_ids) -> bool:
        """True keeps the pages until get_finished reports the request's saves done."""

    def request_finished_by_layer_group(self, request, cache_block_ids_by_layer_group) -> bool:
        if len(cache_block_ids_by_layer_group) != 1:
            raise NotImplementedError(f"{type(self).__name__} does not implement request_finished_by_layer_group")
        return self.request_finished(request, cache_block_ids_by_layer_group[0])

    @abstractmethod
    def update_state_after_alloc(self, request, block_ids):
        """The pages allocated after the lookup."""

    def update_state_after_alloc_by_layer_group(self, request, block_ids_by_layer_group) -> None:
        if len(block_ids_by_layer_group) != 1:
            raise NotImplementedError(
                f"{type(self).__name__} does not implement update_state_after_alloc_by_layer_group"
            )
        self.update_state_after_alloc(request, block_ids_by_layer_group[0])

    def wait_for_initialization(self):
        return None

    # Seed hooks (optional).
    def cancel_load(self, request, start, end):
        return None

    def request_reset(self, request):
        return None


# The KVCacheManagerV2 layout a worker's register_kv_cache_layout receives
# (tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_layout.py at 0972960b): the same field
# names, without the tensor views.


@dataclass(frozen=True)
class KvCacheBufferRef:
    layer_id: int
    role: str
    expansion: int = 1


@dataclass(frozen=True)
class KvCacheRegion:
    """Bytes that repeat per page slot: slot i at base + stride * i, size bytes."""

    base: int
    size: int
    stride: int
    num_slots: int
    buffers: tuple = ()

    def address_of(self, slot_id: int) -> int:
        if not 0 <= slot_id < self.num_slots:
            raise IndexError(f"slot_id {slot_id} out of range [0, {self.num_slots})")
        return self.base + self.stride * slot_id


@dataclass(frozen=True)
class KvCacheLayerGroupLayout:
    layer_group_id: int
    layer_ids: tuple
    window_size: int | None
    regions: tuple
    replicated_regions: tuple = ()

    @property
    def bytes_per_page(self) -> int:
        return sum(r.size for r in self.regions)


@dataclass(frozen=True)
class KvCacheLayout:
    tokens_per_block: int
    groups: tuple
    gpu_pool_mapping_bytes: int | None = None

    def as_single_pool_tensor(self):
        return None
