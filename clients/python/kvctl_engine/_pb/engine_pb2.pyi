from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallChannelMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALL_CHANNEL_METHOD_UNSPECIFIED: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_REGISTER: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_UNREGISTER: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_LOOKUP: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_ADMISSION_QUERY: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_CANCEL_LOAD: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_UPDATE_STATE_AFTER_ALLOC: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_BUILD_META: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_REQUEST_FINISHED: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_REQUEST_RESET: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_BIND_META: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_START_LOAD: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_WAIT_FOR_SAVE: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_GET_FINISHED: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_TAKE_FAILED_LOADS: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_TAKE_FAILED_ASYNC_LOADS: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_TAKE_SUBMITTED_SAVES: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_DROP_BOUND_SAVES: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_REGISTER_PROMPT_ARENA: _ClassVar[CallChannelMethod]
    CALL_CHANNEL_METHOD_ATTACH_SCHEDULER: _ClassVar[CallChannelMethod]
CALL_CHANNEL_METHOD_UNSPECIFIED: CallChannelMethod
CALL_CHANNEL_METHOD_REGISTER: CallChannelMethod
CALL_CHANNEL_METHOD_UNREGISTER: CallChannelMethod
CALL_CHANNEL_METHOD_LOOKUP: CallChannelMethod
CALL_CHANNEL_METHOD_ADMISSION_QUERY: CallChannelMethod
CALL_CHANNEL_METHOD_CANCEL_LOAD: CallChannelMethod
CALL_CHANNEL_METHOD_UPDATE_STATE_AFTER_ALLOC: CallChannelMethod
CALL_CHANNEL_METHOD_BUILD_META: CallChannelMethod
CALL_CHANNEL_METHOD_REQUEST_FINISHED: CallChannelMethod
CALL_CHANNEL_METHOD_REQUEST_RESET: CallChannelMethod
CALL_CHANNEL_METHOD_BIND_META: CallChannelMethod
CALL_CHANNEL_METHOD_START_LOAD: CallChannelMethod
CALL_CHANNEL_METHOD_WAIT_FOR_SAVE: CallChannelMethod
CALL_CHANNEL_METHOD_GET_FINISHED: CallChannelMethod
CALL_CHANNEL_METHOD_TAKE_FAILED_LOADS: CallChannelMethod
CALL_CHANNEL_METHOD_TAKE_FAILED_ASYNC_LOADS: CallChannelMethod
CALL_CHANNEL_METHOD_TAKE_SUBMITTED_SAVES: CallChannelMethod
CALL_CHANNEL_METHOD_DROP_BOUND_SAVES: CallChannelMethod
CALL_CHANNEL_METHOD_REGISTER_PROMPT_ARENA: CallChannelMethod
CALL_CHANNEL_METHOD_ATTACH_SCHEDULER: CallChannelMethod

class CallChannelRequest(_message.Message):
    __slots__ = ("fd_token",)
    FD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fd_token: str
    def __init__(self, fd_token: _Optional[str] = ...) -> None: ...

class CallChannelResponse(_message.Message):
    __slots__ = ("max_frame_bytes", "max_message_bytes")
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_frame_bytes: int
    max_message_bytes: int
    def __init__(self, max_frame_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineRef(_message.Message):
    __slots__ = ("engine",)
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    def __init__(self, engine: _Optional[str] = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ("offset", "stride", "size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    stride: int
    size: int
    def __init__(self, offset: _Optional[int] = ..., stride: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class LayerGroup(_message.Message):
    __slots__ = ("id", "slots", "regions", "replicated_regions")
    ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_REGIONS_FIELD_NUMBER: _ClassVar[int]
    id: int
    slots: int
    regions: _containers.RepeatedCompositeFieldContainer[Region]
    replicated_regions: _containers.RepeatedCompositeFieldContainer[Region]
    def __init__(self, id: _Optional[int] = ..., slots: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[Region, _Mapping]]] = ..., replicated_regions: _Optional[_Iterable[_Union[Region, _Mapping]]] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("tokens_per_block", "groups")
    TOKENS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    tokens_per_block: int
    groups: _containers.RepeatedCompositeFieldContainer[LayerGroup]
    def __init__(self, tokens_per_block: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[LayerGroup, _Mapping]]] = ...) -> None: ...

class SharedMemory(_message.Message):
    __slots__ = ("fd_token", "size")
    FD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    fd_token: str
    size: int
    def __init__(self, fd_token: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class CudaIPC(_message.Message):
    __slots__ = ("handle", "offset", "size", "device")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    offset: int
    size: int
    device: int
    def __init__(self, handle: _Optional[bytes] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., device: _Optional[int] = ...) -> None: ...

class CudaFD(_message.Message):
    __slots__ = ("fd_token", "size", "device")
    FD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    fd_token: str
    size: int
    device: int
    def __init__(self, fd_token: _Optional[str] = ..., size: _Optional[int] = ..., device: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("engine", "model_key", "namespace", "world_size", "rank", "attention_dp", "role", "format", "prompt_lookahead", "scheduler", "layout", "shared_memory", "cuda_ipc", "cuda_fd", "transfer_batch_size", "async_load", "async_load_workers", "soft_pin_ttl_ms", "group_blocks", "local_reuse_backoff", "speculative_prefill", "drafter", "key_params", "staging_buffer_bytes", "api_version", "engine_event", "early_loads")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_KEY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_DP_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOOKAHEAD_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_FIELD_NUMBER: _ClassVar[int]
    CUDA_FD_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ASYNC_LOAD_FIELD_NUMBER: _ClassVar[int]
    ASYNC_LOAD_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_REUSE_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_PREFILL_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    KEY_PARAMS_FIELD_NUMBER: _ClassVar[int]
    STAGING_BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_EVENT_FIELD_NUMBER: _ClassVar[int]
    EARLY_LOADS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    model_key: str
    namespace: str
    world_size: int
    rank: int
    attention_dp: bool
    role: str
    format: str
    prompt_lookahead: int
    scheduler: bool
    layout: Layout
    shared_memory: SharedMemory
    cuda_ipc: CudaIPC
    cuda_fd: CudaFD
    transfer_batch_size: int
    async_load: bool
    async_load_workers: int
    soft_pin_ttl_ms: int
    group_blocks: bool
    local_reuse_backoff: str
    speculative_prefill: bool
    drafter: str
    key_params: KeyParams
    staging_buffer_bytes: int
    api_version: ApiVersion
    engine_event: CudaEvent
    early_loads: bool
    def __init__(self, engine: _Optional[str] = ..., model_key: _Optional[str] = ..., namespace: _Optional[str] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., attention_dp: _Optional[bool] = ..., role: _Optional[str] = ..., format: _Optional[str] = ..., prompt_lookahead: _Optional[int] = ..., scheduler: _Optional[bool] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., shared_memory: _Optional[_Union[SharedMemory, _Mapping]] = ..., cuda_ipc: _Optional[_Union[CudaIPC, _Mapping]] = ..., cuda_fd: _Optional[_Union[CudaFD, _Mapping]] = ..., transfer_batch_size: _Optional[int] = ..., async_load: _Optional[bool] = ..., async_load_workers: _Optional[int] = ..., soft_pin_ttl_ms: _Optional[int] = ..., group_blocks: _Optional[bool] = ..., local_reuse_backoff: _Optional[str] = ..., speculative_prefill: _Optional[bool] = ..., drafter: _Optional[str] = ..., key_params: _Optional[_Union[KeyParams, _Mapping]] = ..., staging_buffer_bytes: _Optional[int] = ..., api_version: _Optional[_Union[ApiVersion, _Mapping]] = ..., engine_event: _Optional[_Union[CudaEvent, _Mapping]] = ..., early_loads: _Optional[bool] = ...) -> None: ...

class KeyParams(_message.Message):
    __slots__ = ("python_hash_seed", "model", "cache_prefix", "store_namespace", "hash_block_size", "num_kv_heads", "mla", "pp_rank", "pp_size", "pcp_rank", "pcp_size", "dcp_rank", "dcp_size", "extra_keys")
    PYTHON_HASH_SEED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CACHE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    STORE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASH_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    MLA_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PCP_RANK_FIELD_NUMBER: _ClassVar[int]
    PCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DCP_RANK_FIELD_NUMBER: _ClassVar[int]
    DCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_KEYS_FIELD_NUMBER: _ClassVar[int]
    python_hash_seed: str
    model: str
    cache_prefix: str
    store_namespace: str
    hash_block_size: int
    num_kv_heads: int
    mla: bool
    pp_rank: int
    pp_size: int
    pcp_rank: int
    pcp_size: int
    dcp_rank: int
    dcp_size: int
    extra_keys: str
    def __init__(self, python_hash_seed: _Optional[str] = ..., model: _Optional[str] = ..., cache_prefix: _Optional[str] = ..., store_namespace: _Optional[str] = ..., hash_block_size: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., mla: _Optional[bool] = ..., pp_rank: _Optional[int] = ..., pp_size: _Optional[int] = ..., pcp_rank: _Optional[int] = ..., pcp_size: _Optional[int] = ..., dcp_rank: _Optional[int] = ..., dcp_size: _Optional[int] = ..., extra_keys: _Optional[str] = ...) -> None: ...

class ApiVersion(_message.Message):
    __slots__ = ("major", "minor")
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    major: int
    minor: int
    def __init__(self, major: _Optional[int] = ..., minor: _Optional[int] = ...) -> None: ...

class CudaEvent(_message.Message):
    __slots__ = ("handle", "device")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    device: int
    def __init__(self, handle: _Optional[bytes] = ..., device: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("engine", "shard", "declarations", "api_version", "daemon_event", "scheduler_token")
    class DeclarationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    DECLARATIONS_FIELD_NUMBER: _ClassVar[int]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    DAEMON_EVENT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    engine: str
    shard: str
    declarations: _containers.ScalarMap[str, bool]
    api_version: ApiVersion
    daemon_event: CudaEvent
    scheduler_token: str
    def __init__(self, engine: _Optional[str] = ..., shard: _Optional[str] = ..., declarations: _Optional[_Mapping[str, bool]] = ..., api_version: _Optional[_Union[ApiVersion, _Mapping]] = ..., daemon_event: _Optional[_Union[CudaEvent, _Mapping]] = ..., scheduler_token: _Optional[str] = ...) -> None: ...

class AttachSchedulerRequest(_message.Message):
    __slots__ = ("engine", "scheduler_token")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    engine: str
    scheduler_token: str
    def __init__(self, engine: _Optional[str] = ..., scheduler_token: _Optional[str] = ...) -> None: ...

class AttachSchedulerResponse(_message.Message):
    __slots__ = ("engine", "shard", "declarations")
    class DeclarationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    DECLARATIONS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    shard: str
    declarations: _containers.ScalarMap[str, bool]
    def __init__(self, engine: _Optional[str] = ..., shard: _Optional[str] = ..., declarations: _Optional[_Mapping[str, bool]] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("id", "tokens", "cache_salt", "lora_task_id", "multimodal_digests", "has_multimodal", "dummy", "context_only", "tokens_packed", "tokens_arena", "lora_name", "mm_features", "lora_path")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    HAS_MULTIMODAL_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ONLY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PACKED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_ARENA_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    MM_FEATURES_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: str
    lora_task_id: int
    multimodal_digests: _containers.RepeatedScalarFieldContainer[bytes]
    has_multimodal: bool
    dummy: bool
    context_only: bool
    tokens_packed: bytes
    tokens_arena: ArenaRange
    lora_name: str
    mm_features: _containers.RepeatedCompositeFieldContainer[MMFeature]
    lora_path: str
    def __init__(self, id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[str] = ..., lora_task_id: _Optional[int] = ..., multimodal_digests: _Optional[_Iterable[bytes]] = ..., has_multimodal: _Optional[bool] = ..., dummy: _Optional[bool] = ..., context_only: _Optional[bool] = ..., tokens_packed: _Optional[bytes] = ..., tokens_arena: _Optional[_Union[ArenaRange, _Mapping]] = ..., lora_name: _Optional[str] = ..., mm_features: _Optional[_Iterable[_Union[MMFeature, _Mapping]]] = ..., lora_path: _Optional[str] = ...) -> None: ...

class MMFeature(_message.Message):
    __slots__ = ("identifier", "offset", "length")
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    identifier: str
    offset: int
    length: int
    def __init__(self, identifier: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ArenaRange(_message.Message):
    __slots__ = ("offset", "count")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    count: int
    def __init__(self, offset: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class PromptArenaRequest(_message.Message):
    __slots__ = ("engine", "fd_token", "size")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    fd_token: str
    size: int
    def __init__(self, engine: _Optional[str] = ..., fd_token: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("engine", "request", "num_computed_tokens")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    request: Request
    num_computed_tokens: int
    def __init__(self, engine: _Optional[str] = ..., request: _Optional[_Union[Request, _Mapping]] = ..., num_computed_tokens: _Optional[int] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("matched_tokens",)
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ASYNC_FIELD_NUMBER: _ClassVar[int]
    matched_tokens: int
    def __init__(self, matched_tokens: _Optional[int] = ..., **kwargs) -> None: ...

class CancelLoadRequest(_message.Message):
    __slots__ = ("engine", "request_id", "start", "end")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    engine: str
    request_id: str
    start: int
    end: int
    def __init__(self, engine: _Optional[str] = ..., request_id: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class BlockIDs(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AllocRequest(_message.Message):
    __slots__ = ("engine", "request_id", "block_ids_by_group", "honoured_tokens", "dummy")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_BY_GROUP_FIELD_NUMBER: _ClassVar[int]
    HONOURED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    engine: str
    request_id: str
    block_ids_by_group: _containers.RepeatedCompositeFieldContainer[BlockIDs]
    honoured_tokens: int
    dummy: bool
    def __init__(self, engine: _Optional[str] = ..., request_id: _Optional[str] = ..., block_ids_by_group: _Optional[_Iterable[_Union[BlockIDs, _Mapping]]] = ..., honoured_tokens: _Optional[int] = ..., dummy: _Optional[bool] = ...) -> None: ...

class RequestData(_message.Message):
    __slots__ = ("id", "new_tokens", "new_block_ids_by_group", "computed_position", "num_scheduled_tokens", "dummy")
    ID_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_IDS_BY_GROUP_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_POSITION_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    id: str
    new_tokens: _containers.RepeatedScalarFieldContainer[int]
    new_block_ids_by_group: _containers.RepeatedCompositeFieldContainer[BlockIDs]
    computed_position: int
    num_scheduled_tokens: int
    dummy: bool
    def __init__(self, id: _Optional[str] = ..., new_tokens: _Optional[_Iterable[int]] = ..., new_block_ids_by_group: _Optional[_Iterable[_Union[BlockIDs, _Mapping]]] = ..., computed_position: _Optional[int] = ..., num_scheduled_tokens: _Optional[int] = ..., dummy: _Optional[bool] = ...) -> None: ...

class BuildMetaRequest(_message.Message):
    __slots__ = ("engine", "new_requests", "cached_requests", "submitted_saves")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_SAVES_FIELD_NUMBER: _ClassVar[int]
    engine: str
    new_requests: _containers.RepeatedCompositeFieldContainer[RequestData]
    cached_requests: _containers.RepeatedCompositeFieldContainer[RequestData]
    submitted_saves: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, engine: _Optional[str] = ..., new_requests: _Optional[_Iterable[_Union[RequestData, _Mapping]]] = ..., cached_requests: _Optional[_Iterable[_Union[RequestData, _Mapping]]] = ..., submitted_saves: _Optional[_Iterable[str]] = ...) -> None: ...

class PageTransfer(_message.Message):
    __slots__ = ("hash", "group", "page")
    HASH_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    hash: bytes
    group: int
    page: int
    def __init__(self, hash: _Optional[bytes] = ..., group: _Optional[int] = ..., page: _Optional[int] = ...) -> None: ...

class RequestTransfers(_message.Message):
    __slots__ = ("request_id", "pages")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    pages: _containers.RepeatedCompositeFieldContainer[PageTransfer]
    def __init__(self, request_id: _Optional[str] = ..., pages: _Optional[_Iterable[_Union[PageTransfer, _Mapping]]] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("loads", "saves", "async_loads", "early_loads")
    LOADS_FIELD_NUMBER: _ClassVar[int]
    SAVES_FIELD_NUMBER: _ClassVar[int]
    ASYNC_LOADS_FIELD_NUMBER: _ClassVar[int]
    EARLY_LOADS_FIELD_NUMBER: _ClassVar[int]
    loads: _containers.RepeatedCompositeFieldContainer[RequestTransfers]
    saves: _containers.RepeatedCompositeFieldContainer[RequestTransfers]
    async_loads: _containers.RepeatedCompositeFieldContainer[RequestTransfers]
    early_loads: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, loads: _Optional[_Iterable[_Union[RequestTransfers, _Mapping]]] = ..., saves: _Optional[_Iterable[_Union[RequestTransfers, _Mapping]]] = ..., async_loads: _Optional[_Iterable[_Union[RequestTransfers, _Mapping]]] = ..., early_loads: _Optional[_Iterable[str]] = ...) -> None: ...

class BindMetaRequest(_message.Message):
    __slots__ = ("engine", "metadata")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    engine: str
    metadata: Metadata
    def __init__(self, engine: _Optional[str] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ...) -> None: ...

class RequestRef(_message.Message):
    __slots__ = ("engine", "request_id", "dummy")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DUMMY_FIELD_NUMBER: _ClassVar[int]
    engine: str
    request_id: str
    dummy: bool
    def __init__(self, engine: _Optional[str] = ..., request_id: _Optional[str] = ..., dummy: _Optional[bool] = ...) -> None: ...

class RequestFinishedResponse(_message.Message):
    __slots__ = ("async_saving",)
    ASYNC_SAVING_FIELD_NUMBER: _ClassVar[int]
    async_saving: bool
    def __init__(self, async_saving: _Optional[bool] = ...) -> None: ...

class GetFinishedRequest(_message.Message):
    __slots__ = ("engine", "finished_gen", "started_loading", "wait_ms")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_GEN_FIELD_NUMBER: _ClassVar[int]
    STARTED_LOADING_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    finished_gen: _containers.RepeatedScalarFieldContainer[str]
    started_loading: _containers.RepeatedScalarFieldContainer[str]
    wait_ms: int
    def __init__(self, engine: _Optional[str] = ..., finished_gen: _Optional[_Iterable[str]] = ..., started_loading: _Optional[_Iterable[str]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class GetFinishedResponse(_message.Message):
    __slots__ = ("finished_saving", "finished_loading")
    FINISHED_SAVING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_LOADING_FIELD_NUMBER: _ClassVar[int]
    finished_saving: _containers.RepeatedScalarFieldContainer[str]
    finished_loading: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, finished_saving: _Optional[_Iterable[str]] = ..., finished_loading: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestIDs(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DropRequest(_message.Message):
    __slots__ = ("engine", "request_ids")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, engine: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...
