"""Engine deltas -> OpenAI response bodies (completions and chat; whole responses and SSE chunks).

A `Choice` accumulates one choice's deltas; the builders read it. Token strings in logprobs are
the token's bytes decoded as UTF-8 (a token ending inside a character shows U+FFFD; chat's
`bytes` field carries the exact bytes).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

OPENAI_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error", None: None}


@dataclass
class Choice:
    index: int
    prompt_index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0

    def add(self, delta) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs += delta.logprobs
        if delta.top_logprobs is not None:
            self.top_logprobs += delta.top_logprobs
        self.num_prompt_tokens = delta.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        if delta.finished:
            self.finish_reason, self.error = delta.finish_reason, delta.error


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(choices: list[Choice], prompt_lens: list[int]) -> dict:
    """Each prompt counts once (n choices share it); cached: its first choice's prefix-cache hits."""
    prompt = sum(prompt_lens)
    completion = sum(len(c.token_ids) for c in choices)
    cached: dict[int, int] = {}
    for c in choices:
        cached.setdefault(c.prompt_index, c.num_cached_tokens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}


class TokenStrings:
    """Token id -> (text, bytes) for logprobs."""

    def __init__(self, token_bytes: list[bytes]):
        self._bytes = token_bytes

    def text(self, token_id: int) -> str:
        return self._bytes[token_id].decode("utf-8", errors="replace") if 0 <= token_id < len(self._bytes) else ""

    def raw(self, token_id: int) -> list[int]:
        return list(self._bytes[token_id]) if 0 <= token_id < len(self._bytes) else []


# ---------------------------------------------------------------------- completions
def completion_logprobs(tok: TokenStrings, token_ids, logprobs, top, text_start: int = 0) -> dict:
    offsets, pos = [], text_start
    tokens = [tok.text(t) for t in token_ids]
    for s in tokens:
        offsets.append(pos)
        pos += len(s)
    return {"tokens": tokens, "token_logprobs": list(logprobs),
            "top_logprobs": [{tok.text(t): lp for t, lp in d.items()} for d in top] if top else None,
            "text_offset": offsets}


def completion_response(rid: str, model: str, choices: list[Choice], prompt_lens: list[int], tok: TokenStrings,
                        want_logprobs: bool) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": c.index, "text": c.text, "finish_reason": OPENAI_FINISH[c.finish_reason],
                         "logprobs": completion_logprobs(tok, c.token_ids, c.logprobs, c.top_logprobs)
                         if want_logprobs else None} for c in choices],
            "usage": usage(choices, prompt_lens)}


def completion_chunk(rid: str, model: str, index: int, delta, tok: TokenStrings, want_logprobs: bool,
                     text_start: int, with_usage_field: bool) -> dict:
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "text": delta.text,
                         "finish_reason": OPENAI_FINISH[delta.finish_reason] if delta.finished else None,
                         "logprobs": completion_logprobs(tok, delta.token_ids, delta.logprobs or [],
                                                         delta.top_logprobs, text_start)
                         if want_logprobs else None}]}
    if with_usage_field:
        body["usage"] = None
    return body


# ---------------------------------------------------------------------- chat
def chat_logprobs(tok: TokenStrings, token_ids, logprobs, top) -> dict:
    content = []
    for k, (t, lp) in enumerate(zip(token_ids, logprobs)):
        alts = top[k] if top and k < len(top) else {}
        content.append({"token": tok.text(t), "logprob": lp, "bytes": tok.raw(t),
                        "top_logprobs": [{"token": tok.text(a), "logprob": v, "bytes": tok.raw(a)}
                                         for a, v in sorted(alts.items(), key=lambda kv: -kv[1])]})
    return {"content": content, "refusal": None}


def chat_response(rid: str, model: str, choices: list[Choice], prompt_lens: list[int], tok: TokenStrings,
                  want_logprobs: bool) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text, "refusal": None},
                         "finish_reason": OPENAI_FINISH[c.finish_reason],
                         "logprobs": chat_logprobs(tok, c.token_ids, c.logprobs, c.top_logprobs)
                         if want_logprobs else None} for c in choices],
            "usage": usage(choices, prompt_lens)}


def chat_chunk(rid: str, model: str, index: int, delta_body: dict, finish_reason: str | None,
               logprobs: dict | None, with_usage_field: bool) -> dict:
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta_body, "logprobs": logprobs,
                         "finish_reason": OPENAI_FINISH[finish_reason]}]}
    if with_usage_field:
        body["usage"] = None
    return body


def usage_chunk(rid: str, model: str, obj: str, choices: list[Choice], prompt_lens: list[int]) -> dict:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(choices, prompt_lens)}
