"""Prompts as Request.tokens_packed: 8 bytes a token, little-endian two's-complement int64."""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence

from .errors import InvalidArgument

__all__ = ["MAX_REQUEST_TOKENS", "TOKEN_BYTES", "pack_tokens", "unpack_tokens"]

TOKEN_BYTES = 8
# MAX_REQUEST_TOKENS is the most tokens a request may carry (core/engineapi MaxRequestTokens);
# the daemon's configured limit may be lower.
MAX_REQUEST_TOKENS = 4 << 20


def pack_tokens(tokens: Sequence[int] | array.array) -> bytes:
    """tokens in the tokens_packed encoding. An array('q') or a sequence of ints; raises
    InvalidArgument for more than MAX_REQUEST_TOKENS tokens or a token outside int64."""
    if len(tokens) > MAX_REQUEST_TOKENS:
        raise InvalidArgument("a prompt of %d tokens, more than the %d allowed" % (len(tokens), MAX_REQUEST_TOKENS))
    if isinstance(tokens, array.array) and tokens.typecode == "q":
        a = tokens
    else:
        try:
            a = array.array("q", tokens)
        except OverflowError as e:
            raise InvalidArgument("a token does not fit in int64: %s" % e) from e
    if sys.byteorder != "little":
        a = array.array("q", a)
        a.byteswap()
    return a.tobytes()


def unpack_tokens(packed: bytes | memoryview) -> list[int]:
    """The tokens of a tokens_packed value; raises InvalidArgument when its length is not a
    multiple of 8."""
    if len(packed) % TOKEN_BYTES:
        raise InvalidArgument("packed tokens of %d bytes, not a multiple of %d" % (len(packed), TOKEN_BYTES))
    a = array.array("q")
    a.frombytes(bytes(packed))
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()
