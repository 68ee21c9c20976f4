"""Per-request sampling parameters, validated on construction and again against the model's vocabulary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.structured_output.spec import StructuredOutput, coerce

UINT64_MAX = 2**64 - 1
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass
class SamplingParams:
    """How to sample one request.

    temperature: 0 means greedy; > 0 scales logits before sampling.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    top_k: -1 disables it; otherwise >= 1 tokens are kept.
    max_tokens: output tokens to generate at most (>= 1).
    min_tokens: EOS and stop ids are ignored until this many tokens exist.
    seed: per-request seed (uint64). Sampling is a function of (seed, position) alone, so a seeded
        request gives the same tokens at any batch size or order. None draws one from the engine.
    stop_token_ids: extra token ids that finish the request (the stop token is emitted).
    ignore_eos: keep generating past EOS (until max_tokens or a stop id).
    logprobs: None = no logprobs; k >= 0 = the sampled token's logprob plus the top-k alternatives.
    prompt_logprobs: None = none; k >= 0 = the logprob of every prompt token (from the second on)
        under the full model plus the top-k alternatives (one extra dense forward of the prompt).
    stop: strings that finish the request when they appear in the output text (across token
        boundaries, inside accepted draft blocks too); finish_reason "stop", `stop_str` records it.
    include_stop_str_in_output: keep the matched stop string at the end of the text.
    structured_output: a StructuredOutput (json_schema | regex | grammar | json_object) that every
        output must match; the request finishes ("stop") when the grammar completes.
    presence_penalty / frequency_penalty: in [-2, 2]; subtracted from the logit of every token the
        output already holds, once (presence) / per occurrence (frequency). 0 disables.
    repetition_penalty: in (0, 2]; a token seen in the prompt or the output has its logit divided
        by it (positive logits) or multiplied by it (negative ones). 1 disables. (penalties.py)
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    min_tokens: int = 0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    structured_output: StructuredOutput | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.structured_output = coerce(self.structured_output)
        self.validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError naming the first bad field and its limit."""
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0:
            raise InvalidRequestError("temperature", f"must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or math.isnan(p) or not (0.0 < p <= 1.0):
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {p!r}")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError("top_k", f"must be -1 (disabled) or >= 1, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not (0 <= self.min_tokens <= self.max_tokens):
            raise InvalidRequestError(
                "min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not (0 <= self.seed <= UINT64_MAX)):
            raise InvalidRequestError("seed", f"must be None or an integer in [0, 2**64 - 1], got {self.seed!r}")
        if self.logprobs is not None and (
                not isinstance(self.logprobs, int) or not (0 <= self.logprobs <= MAX_TOP_LOGPROBS)):
            raise InvalidRequestError("logprobs", f"must be None or in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        for token_id in self.stop_token_ids:
            if not isinstance(token_id, int) or token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                raise InvalidRequestError("stop_token_ids", f"token id {token_id!r} is outside the vocabulary {limit}")
        if self.prompt_logprobs is not None and (
                not isinstance(self.prompt_logprobs, int) or isinstance(self.prompt_logprobs, bool)
                or not (0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS)):
            raise InvalidRequestError(
                "prompt_logprobs", f"must be None or in [0, {MAX_TOP_LOGPROBS}], got {self.prompt_logprobs!r}")
        if not isinstance(self.stop, (list, tuple)) or len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError("stop", f"must be a list of at most {MAX_STOP_STRINGS} strings, got {self.stop!r}")
        for s in self.stop:
            if not isinstance(s, str) or not (1 <= len(s) <= MAX_STOP_STRING_CHARS):
                raise InvalidRequestError(
                    "stop", f"each stop string must be a str of 1..{MAX_STOP_STRING_CHARS} characters, got {s!r}")
        if not isinstance(self.include_stop_str_in_output, bool):
            raise InvalidRequestError("include_stop_str_in_output",
                                      f"must be a bool, got {self.include_stop_str_in_output!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (-2.0 <= v <= 2.0):
                raise InvalidRequestError(name, f"must be a number in [-2, 2], got {v!r}")
        r = self.repetition_penalty
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not (0.0 < r <= 2.0):
            raise InvalidRequestError("repetition_penalty", f"must be a number in (0, 2], got {r!r}")
        if self.structured_output is not None:
            if not isinstance(self.structured_output, StructuredOutput):
                raise InvalidRequestError("structured_output", "expected a StructuredOutput, got "
                                          f"{type(self.structured_output).__name__}")
            self.structured_output.validate()
