"""Host shared memory for kvctl serve: KV pages in a sealed memfd, and prompt arenas.

kvctl serve maps an engine's shared memory itself, so it accepts only a memfd sealed with
F_SEAL_SHRINK (core/daemon/ownership.go checkSharedMemory): a file the engine could truncate under
the daemon's mapping would fault in the daemon. The memfd must also hold at least the registered
size. :class:`SharedMemory` creates one sealed with F_SEAL_SHRINK and F_SEAL_GROW, as the Go
client does (core/hostmem); :func:`check_sealed` is the daemon's check, run before a descriptor is
sent so that the error comes with the descriptor's name.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading

from .errors import InvalidArgument

__all__ = [
    "DEFAULT_PROMPT_ARENA_BYTES",
    "F_ADD_SEALS",
    "F_GET_SEALS",
    "F_SEAL_GROW",
    "F_SEAL_SHRINK",
    "PromptArena",
    "SharedMemory",
    "check_sealed",
    "sealed_memfd",
]

# fcntl commands and seals (linux/fcntl.h); Python's fcntl module has them from 3.9 on Linux,
# but not on every build.
F_ADD_SEALS: int = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS: int = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK: int = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW: int = getattr(fcntl, "F_SEAL_GROW", 0x0004)

# DEFAULT_PROMPT_ARENA_BYTES is the size of the arena a Rank creates (as the Go RemoteRank):
# 8 MiB, one million-token prompt or 32 concurrent 32k-token lookups. The daemon maps at most
# 64 MiB unless configured otherwise.
DEFAULT_PROMPT_ARENA_BYTES = 8 << 20


def sealed_memfd(name: str, size: int) -> int:
    """A new memfd of size bytes sealed with F_SEAL_SHRINK and F_SEAL_GROW; the caller owns it."""
    if size <= 0:
        raise InvalidArgument("shared memory %r: size must be positive, got %d" % (name, size))
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_sealed(fd: int, size: int) -> None:
    """Raises InvalidArgument, naming the problem, unless fd is a memfd sealed with F_SEAL_SHRINK
    that holds at least size bytes: what kvctl serve checks of engine memory and prompt arenas."""
    try:
        seals = fcntl.fcntl(fd, F_GET_SEALS)
    except OSError as e:
        raise InvalidArgument(
            "descriptor %d cannot carry seals (%s): engine memory must be a memfd created with "
            "MFD_ALLOW_SEALING and sealed with F_SEAL_SHRINK" % (fd, e.strerror)
        ) from e
    if not seals & F_SEAL_SHRINK:
        raise InvalidArgument(
            "memfd %d is not sealed against shrinking: add F_SEAL_SHRINK (fcntl F_ADD_SEALS) before "
            "registering it, or create it with kvctl_engine.SharedMemory" % fd
        )
    have = os.fstat(fd).st_size
    if have < size:
        raise InvalidArgument("memfd %d has %d bytes, fewer than the %d registered" % (fd, have, size))


class SharedMemory:
    """KV memory in a sealed memfd, mapped read-write here.

    ``buf`` is the mapping (an mmap, usable as a buffer: ``memoryview(shm.buf)``,
    ``numpy.frombuffer``, ``torch.frombuffer``); ``fd`` the descriptor registered with the
    daemon, which maps its own copy. Close unmaps and closes; the daemon's mapping lives until
    the rank unregisters."""

    def __init__(self, size: int, name: str = "kvctl-engine-kv") -> None:
        self.size = size
        self.fd = sealed_memfd(name, size)
        try:
            self.buf = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.buf.close()
        except BufferError:
            pass  # a view of the mapping is still alive; it goes with the process
        os.close(self.fd)

    def __enter__(self) -> SharedMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PromptArena:
    """The engine's side of a prompt arena (RegisterPromptArena in engine.proto): a sealed memfd
    the engine writes prompts into, and a first-fit allocator of byte ranges in it, so that a
    Lookup names a range (Request.tokens_arena) instead of carrying the prompt. Thread-safe.

    A range stays reserved until :meth:`free`; a call that timed out may still be read by the
    daemon, so its range is not freed (the Rank does this)."""

    def __init__(self, size: int = DEFAULT_PROMPT_ARENA_BYTES) -> None:
        page = mmap.PAGESIZE
        size = (size + page - 1) // page * page
        self._shm = SharedMemory(size, "kvctl-prompt-arena")
        self.size = size
        self.fd = self._shm.fd
        self._mu = threading.Lock()
        self._held: list[tuple[int, int]] = []  # sorted (offset, end)

    def alloc(self, nbytes: int) -> int | None:
        """The offset of a free range of nbytes (8-byte aligned), or None when none is free."""
        if nbytes <= 0 or nbytes > self.size:
            return None
        with self._mu:
            at = 0
            for i, (off, end) in enumerate(self._held):
                if off - at >= nbytes:
                    self._held.insert(i, (at, at + nbytes))
                    return at
                at = (end + 7) & ~7
            if self.size - at >= nbytes:
                self._held.append((at, at + nbytes))
                return at
        return None

    def write(self, offset: int, packed: bytes) -> None:
        """Writes packed (tokens_packed encoding) at offset, a range alloc returned."""
        self._shm.buf[offset : offset + len(packed)] = packed

    def free(self, offset: int) -> None:
        """Releases the range alloc returned at offset."""
        with self._mu:
            for i, (off, _) in enumerate(self._held):
                if off == offset:
                    del self._held[i]
                    return

    def held_bytes(self) -> int:
        with self._mu:
            return sum(end - off for off, end in self._held)

    def close(self) -> None:
        self._shm.close()
