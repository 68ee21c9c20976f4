"""The checks every request passes before it is queued, shared by LLMEngine and the DP front end."""

from __future__ import annotations

import numpy as np

from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.sampling_params import SamplingParams


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """The prompt's token ids (InvalidRequestError without a tokenizer)."""
    if tokenizer is None:
        raise InvalidRequestError("prompt", "this model has no tokenizer; pass prompt_token_ids")
    return tokenizer.encode(prompt)


def validate_request(prompt: str | None, prompt_token_ids: list[int] | None, params: SamplingParams,
                     *, tokenizer, vocab_size: int) -> list[int]:
    """Token ids of a valid request; raises InvalidRequestError naming the field and the limit."""
    if prompt_token_ids is None:
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequestError("prompt", "must be a non-empty string")
        prompt_token_ids = encode_prompt(tokenizer, prompt)
        if not prompt_token_ids:
            raise InvalidRequestError("prompt", "encodes to zero tokens")
    else:
        prompt_token_ids = list(prompt_token_ids)
        if not prompt_token_ids:
            raise InvalidRequestError("prompt_token_ids", "must contain at least 1 token")
        prompt_token_ids = _checked_ids(prompt_token_ids, vocab_size)
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError("sampling_params", f"expected SamplingParams, got {type(params).__name__}")
    params.validate(vocab_size)
    if (params.structured_output is not None or params.stop) and tokenizer is None:
        field = "structured_output" if params.structured_output is not None else "stop"
        raise InvalidRequestError(field, "needs a model with a tokenizer (text-level constraint)")
    return prompt_token_ids


def _checked_ids(ids: list, vocab_size: int) -> list[int]:
    """`ids` as Python ints in [0, vocab_size). Plain ints in range (the usual case) are checked at C
    speed (a long prompt's per-token Python loop cost ~2 us a token); anything else takes the
    per-token path that names the first bad one."""
    if set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < vocab_size:
        return ids
    for i, t in enumerate(ids):
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not (0 <= int(t) < vocab_size):
            raise InvalidRequestError(
                "prompt_token_ids", f"token id {t!r} at index {i} is outside the vocabulary [0, {vocab_size})")
    return [int(t) for t in ids]
