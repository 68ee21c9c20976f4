"""GPT-2's byte <-> printable-character table: how byte-level BPE tokenizers (the `tokenizers`
ByteLevel pre-tokenizer) spell raw bytes in their vocabulary."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """byte value -> the character that spells it in a ByteLevel vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@functools.lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse table: ByteLevel vocabulary character -> byte value."""
    return {c: b for b, c in bytes_to_unicode().items()}
