"""What `LLM.generate` returns: one GenerationOutput per request, in input order."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationOutput:
    request_id: int
    prompt: str | None                   # the prompt text when given as text
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None              # detokenized output when a tokenizer is present
    token_logprobs: list[float] | None = None         # per output token, clamped >= -9999
    top_logprobs: list[dict[int, float]] | None = None  # per output token, when logprobs=k > 0
    finish_reason: str | None = None     # stop | length | abort | prompt_length_exceeded | error
    stop_token_id: int | None = None     # the id that finished the request (EOS or a stop id)
    stop_str: str | None = None          # the stop string that finished the request (SamplingParams.stop)
    prompt_logprobs: list[float | None] | None = None  # per prompt token (None for the first), >= -9999
    prompt_top_logprobs: list[dict[int, float] | None] | None = None  # per prompt token, prompt_logprobs=k > 0
    error: str | None = None             # set when the request was rejected (finish_reason "error")
    num_draft_tokens: int = 0            # drafts verified for this request (speculation)
    num_accepted_tokens: int = 0         # drafts accepted
    num_cached_tokens: int = 0           # prompt tokens served from the prefix cache

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per decode step of this request (1 + accepted drafts per step)."""
        steps = max(1, len(self.token_ids) - self.num_accepted_tokens)
        return len(self.token_ids) / steps


@dataclass
class StreamDelta:
    """What one request gained in one engine step (`LLM.generate_stream`).

    Concatenating a request's `text` deltas gives its final `output.text` exactly; `token_ids`
    deltas concatenate to `output.token_ids`. Text that may still turn into a stop string, and the
    bytes of an unfinished UTF-8 character, are held back until decided."""

    index: int                     # position of the request in the generate_stream input
    request_id: int
    text: str                      # newly visible text ("" when nothing is decided yet)
    token_ids: list[int]           # new output tokens
    finished: bool
    output: GenerationOutput       # the request's cumulative output (final once finished)
