"""kvctl_engine: the Python engine SDK of kvctl serve.

An inference engine uses it to hand its KV memory to `kvctl serve` and to drive the connector:
prefix lookups, page loads and saves, request completion. The high level is :class:`Rank`, with
the methods of the Go connector.Rank; the low level is :class:`Client` (any engine API call over
gRPC or a call channel), the descriptor side channel (:func:`send_fd`), sealed shared memory
(:class:`SharedMemory`, :class:`PromptArena`), CUDA handles (``kvctl_engine.cuda``) and packed
tokens. Errors are the classes of ``kvctl_engine.errors``, one per outcome an engine handles
differently. docs/ENGINE_API.md in the kvctl repository is the contract.

    import kvctl_engine as kv

    client = kv.connect()                      # $KVCTL_SOCKET or kvctl serve's default socket
    shm = kv.SharedMemory(slots * page_bytes)
    layout = kv.Layout(32, [kv.LayerGroup(0, slots, [kv.Region(0, page_bytes, page_bytes)])])
    rank = kv.Rank.register(client, "my-model/rank0", layout, shm, model_key="my-model")
    hit = rank.lookup(kv.Request("req-1", tokens))
"""

from .callchan import CallChannel, CallChannelStats
from .client import API_VERSION, CALL_CHANNEL_METHODS, DEFAULT_TIMEOUT, MAX_FINISHED_WAIT, SLOW_CALL_TIMEOUT, Client
from .cuda import CudaIpcMemory, VmmAllocation, ipc_handle_from_pointer, ipc_handle_from_tensor
from .discovery import default_socket_path, fd_socket_path, resolve_socket_path
from .errors import (
    AlreadyRegistered,
    CallTimeout,
    Cancelled,
    DaemonUnavailable,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    KvctlError,
    LoadFailed,
    NotOwner,
    NotRegistered,
    ProtocolViolation,
    RequestMustRestart,
    ResourceExhausted,
    Unimplemented,
    UntrustedDaemon,
    VersionMismatch,
)
from .fdpass import send_fd
from .memory import PromptArena, SharedMemory, check_sealed, sealed_memfd
from .rank import (
    CudaFdMemory,
    Finished,
    KeyParams,
    LayerGroup,
    Layout,
    LookupResult,
    Metadata,
    MMFeature,
    PageTransfer,
    Rank,
    RankOptions,
    Region,
    Request,
    RequestData,
    RequestTransfers,
    SchedulerRank,
    SharedMemoryFd,
    connect,
)
from .tokens import MAX_REQUEST_TOKENS, pack_tokens, unpack_tokens

__version__ = "1.0.0"

__all__ = [
    "API_VERSION",
    "CALL_CHANNEL_METHODS",
    "DEFAULT_TIMEOUT",
    "MAX_FINISHED_WAIT",
    "MAX_REQUEST_TOKENS",
    "SLOW_CALL_TIMEOUT",
    "AlreadyRegistered",
    "CallChannel",
    "CallChannelStats",
    "CallTimeout",
    "Cancelled",
    "Client",
    "CudaFdMemory",
    "CudaIpcMemory",
    "DaemonUnavailable",
    "FailedPrecondition",
    "Finished",
    "InternalError",
    "KeyParams",
    "InvalidArgument",
    "KvctlError",
    "LayerGroup",
    "Layout",
    "LoadFailed",
    "LookupResult",
    "MMFeature",
    "Metadata",
    "NotOwner",
    "NotRegistered",
    "PageTransfer",
    "PromptArena",
    "ProtocolViolation",
    "Rank",
    "RankOptions",
    "Region",
    "Request",
    "RequestData",
    "RequestMustRestart",
    "RequestTransfers",
    "ResourceExhausted",
    "SchedulerRank",
    "SharedMemory",
    "SharedMemoryFd",
    "Unimplemented",
    "UntrustedDaemon",
    "VersionMismatch",
    "VmmAllocation",
    "check_sealed",
    "connect",
    "default_socket_path",
    "fd_socket_path",
    "ipc_handle_from_pointer",
    "ipc_handle_from_tensor",
    "pack_tokens",
    "resolve_socket_path",
    "sealed_memfd",
    "send_fd",
    "unpack_tokens",
]
