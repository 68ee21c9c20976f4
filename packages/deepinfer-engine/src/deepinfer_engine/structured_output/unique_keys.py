"""json_object without repeated keys: a mask refinement on top of the grammar's.

A context-free grammar cannot say "every key of an object differs", so xgrammar's `json_object`
grammar lets a model write `{"a": 1, "a": 2}`. `KeyGuard` follows the JSON text the request has
emitted (and the drafts walked tentatively, with the same rollback as the grammar matcher) and,
on every mask row, clears the tokens that would close a key string equal to a key the open
object already has. Only tokens holding a `"` byte can close a key (`KeyGuardTokens.quote_ids`),
and only while an object is open is anything checked, so a row costs a short byte walk over
those tokens. Closing a repeated key is forbidden but extending it is not, so a request is never
left without an allowed token.

State (immutable, one per accepted token, so rollback pops): the stack of open containers
(an object: the keys it has + whether a key comes next; an array: None), and the string being
read (is it a key, its raw bytes, an escape pending).
"""

from __future__ import annotations

import json

import numpy as np
import torch

_OBJECT_START, _OBJECT_END, _ARRAY_START, _ARRAY_END = b"{"[0], b"}"[0], b"["[0], b"]"[0]
_QUOTE, _BACKSLASH, _COLON, _COMMA = b'"'[0], b"\\"[0], b":"[0], b","[0]

# (stack, in_string, is_key, escape, key_bytes); stack entries: (frozenset of keys, expect_key) | None
State = tuple
START: State = ((), False, False, False, b"")


def _key_text(raw: bytes) -> str:
    try:
        return json.loads(b'"' + raw + b'"')
    except (ValueError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")


def advance(state: State, data: bytes) -> tuple[State, bool]:
    """(state after `data`, whether `data` closed a key the open object already had)."""
    stack, in_string, is_key, escape, buf = state
    repeated = False
    for c in data:
        if in_string:
            if escape:
                escape = False
                buf += bytes((c,))
            elif c == _BACKSLASH:
                escape = True
                buf += bytes((c,))
            elif c == _QUOTE:
                in_string = False
                if is_key and stack and stack[-1] is not None:
                    keys, _ = stack[-1]
                    key = _key_text(buf)
                    repeated = repeated or key in keys
                    stack = stack[:-1] + ((keys | {key}, False),)
                buf = b""
            else:
                buf += bytes((c,))
        elif c == _QUOTE:
            in_string, is_key = True, bool(stack) and stack[-1] is not None and stack[-1][1]
        elif c == _OBJECT_START:
            stack = stack + ((frozenset(), True),)
        elif c == _ARRAY_START:
            stack = stack + (None,)
        elif c in (_OBJECT_END, _ARRAY_END):
            stack = stack[:-1]
        elif c == _COMMA and stack and stack[-1] is not None:
            stack = stack[:-1] + ((stack[-1][0], True),)
        elif c == _COLON and stack and stack[-1] is not None:
            stack = stack[:-1] + ((stack[-1][0], False),)
    return (stack, in_string, is_key, escape, buf), repeated


class KeyGuardTokens:
    """The tokens that can close a key (those holding a `"` byte), per tokenizer."""

    def __init__(self, token_bytes: list[bytes]):
        self.token_bytes = token_bytes
        self.quote_ids = np.array([i for i, b in enumerate(token_bytes) if b'"' in b], np.int64)


class KeyGuard:
    def __init__(self, tokens: KeyGuardTokens):
        self.tokens = tokens
        self.history: list[State] = [START]

    @property
    def state(self) -> State:
        return self.history[-1]

    def push(self, token_id: int) -> None:
        data = self.tokens.token_bytes[token_id] if 0 <= token_id < len(self.tokens.token_bytes) else b""
        self.history.append(advance(self.state, data)[0])

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            del self.history[-num_tokens:]

    def restrict(self, bitmask: torch.Tensor, row: int) -> None:
        """Clear, in packed int32 row `row`, the allowed tokens that would close a repeated key."""
        stack = self.state[0]
        if not stack or stack[-1] is None or not stack[-1][0]:   # no open object with keys yet
            return
        ids = self.tokens.quote_ids
        words = bitmask[row].numpy().view(np.uint32)
        allowed = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]
        for t in allowed.tolist():
            if advance(self.state, self.tokens.token_bytes[t])[1]:
                words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
