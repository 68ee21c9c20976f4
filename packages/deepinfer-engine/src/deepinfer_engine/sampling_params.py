"""Per-request sampling parameters, validated on construction and again against the model's vocabulary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.structured_output.spec import StructuredOutput, coerce

UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1          # top_k (SamplingBatch.top_k int32); max_tokens, min_tokens, stop ids (ledger int32)
FLOAT32_MAX = 3.4028234663852886e38    # temperature and top_p travel as float32
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32: a smaller top_p rounds to 0
MIN_TEMPERATURE = 1e-5         # below it, logits / T overflows float32 (vLLM treats T < 1e-5 as greedy)
MAX_TOP_LOGPROBS = 20
MAX_STOP_TOKEN_IDS = 256
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
    stop_at_function_end: finish ("stop") where the code block that the prompt's last line opens
        ends: at the first blank line, or at the first line indented at or left of that line (the
        rule of the default model's function-completion evaluation; stop_strings.FunctionEndRule).
        The text keeps its last newline; `stop_str` is the start of the line that ended the block.
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
    stop_at_function_end: bool = False
    structured_output: StructuredOutput | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.stop_token_ids, (tuple, range)):
            self.stop_token_ids = list(self.stop_token_ids)
        elif self.stop_token_ids is None:
            self.stop_token_ids = []
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        elif self.stop is None:
            self.stop = []
        self.structured_output = coerce(self.structured_output)
        self.validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError naming the first bad field and its limit. Limits include the
        device dtypes a value travels in (INT32_MAX, FLOAT32_MAX); bools are not numbers here."""
        t = self.temperature
        if not _is_real(t) or not (t == 0 or MIN_TEMPERATURE <= t <= FLOAT32_MAX):
            raise InvalidRequestError(
                "temperature", f"must be 0 (greedy) or a number in [{MIN_TEMPERATURE:g}, {FLOAT32_MAX:.4g}] "
                f"(>= 0, float32), got {_short(t)}")
        p = self.top_p
        if not _is_real(p) or not (FLOAT32_TINY <= p <= 1.0):
            raise InvalidRequestError("top_p", f"must be in (0, 1] (at least {FLOAT32_TINY:.3g}: float32), "
                                      f"got {_short(p)}")
        if not _is_int(self.top_k) or not (self.top_k == -1 or 1 <= self.top_k <= INT32_MAX):
            raise InvalidRequestError("top_k", f"must be -1 (disabled) or >= 1 and <= {INT32_MAX} (int32), "
                                      f"got {_short(self.top_k)}")
        if not _is_int(self.max_tokens) or not (1 <= self.max_tokens <= INT32_MAX):
            raise InvalidRequestError("max_tokens", f"must be an integer >= 1 and <= {INT32_MAX} (int32), "
                                      f"got {_short(self.max_tokens)}")
        if not _is_int(self.min_tokens) or not (0 <= self.min_tokens <= self.max_tokens):
            raise InvalidRequestError(
                "min_tokens", f"must be an integer in [0, max_tokens={self.max_tokens}], got {_short(self.min_tokens)}")
        if self.seed is not None and (not _is_int(self.seed) or not (0 <= self.seed <= UINT64_MAX)):
            raise InvalidRequestError("seed", f"must be None or an integer in [0, 2**64 - 1], got {_short(self.seed)}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not (0 <= self.logprobs <= MAX_TOP_LOGPROBS)):
            raise InvalidRequestError("logprobs", f"must be None or in [0, {MAX_TOP_LOGPROBS}], "
                                      f"got {_short(self.logprobs)}")
        if not isinstance(self.stop_token_ids, list) or len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError("stop_token_ids", f"must be a list of at most {MAX_STOP_TOKEN_IDS} token ids, "
                                      f"got {_short(self.stop_token_ids)}")
        for token_id in self.stop_token_ids:
            top = vocab_size if vocab_size is not None else INT32_MAX + 1
            if not _is_int(token_id) or not (0 <= token_id < top):
                limit = f"[0, {vocab_size})" if vocab_size is not None else f"[0, {INT32_MAX}] (>= 0, int32)"
                raise InvalidRequestError("stop_token_ids",
                                          f"token id {_short(token_id)} is outside the vocabulary {limit}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError("ignore_eos", f"must be a bool, got {_short(self.ignore_eos)}")
        if self.prompt_logprobs is not None and (
                not _is_int(self.prompt_logprobs) or not (0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS)):
            raise InvalidRequestError(
                "prompt_logprobs", f"must be None or in [0, {MAX_TOP_LOGPROBS}], got {_short(self.prompt_logprobs)}")
        if not isinstance(self.stop, list) or len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError("stop", f"must be a list of at most {MAX_STOP_STRINGS} strings, "
                                      f"got {_short(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not (1 <= len(s) <= MAX_STOP_STRING_CHARS):
                raise InvalidRequestError(
                    "stop", f"each stop string must be a str of 1..{MAX_STOP_STRING_CHARS} characters, got {_short(s)}")
            if not is_unicode_text(s):
                raise InvalidRequestError("stop", f"stop string {_short(s)} is not valid Unicode (a lone surrogate)")
        if not isinstance(self.include_stop_str_in_output, bool):
            raise InvalidRequestError("include_stop_str_in_output",
                                      f"must be a bool, got {_short(self.include_stop_str_in_output)}")
        if not isinstance(self.stop_at_function_end, bool):
            raise InvalidRequestError("stop_at_function_end", f"must be a bool, got {_short(self.stop_at_function_end)}")
        if self.stop_at_function_end and self.min_tokens:   # the rule reads every character; min_tokens skips some
            raise InvalidRequestError("stop_at_function_end", f"needs min_tokens=0, got min_tokens={self.min_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not (-2.0 <= v <= 2.0):
                raise InvalidRequestError(name, f"must be a number in [-2, 2], got {_short(v)}")
        r = self.repetition_penalty
        if not _is_real(r) or not (0.0 < r <= 2.0):
            raise InvalidRequestError("repetition_penalty", f"must be a number in (0, 2], got {_short(r)}")
        if self.structured_output is not None:
            if not isinstance(self.structured_output, StructuredOutput):
                raise InvalidRequestError("structured_output", "expected a StructuredOutput, got "
                                          f"{type(self.structured_output).__name__}")
            self.structured_output.validate()


def _is_int(x) -> bool:
    """An integer that is not a bool (True would pass as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_unicode_text(s: str) -> bool:
    """s encodes to UTF-8 (no lone surrogates such as '\\ud800')."""
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _short(x) -> str:
    """repr of a user value, cut so an error message stays one short line."""
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."
