"""OpenAI request bodies as pydantic models (strict types: a string is not a number, a bool is not
an integer). Ranges are checked here too, so every error names the field and its limit; the
engine's own validation (SamplingParams) still runs behind them.

Extensions beyond the OpenAI API: `top_k`, `repetition_penalty`, `min_tokens`, `ignore_eos`,
`response_format: {"type": "regex", "regex": ...}`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_N = 16
MAX_STOP = 16
MAX_COMPLETION_LOGPROBS = 5     # the OpenAI limit for completions' `logprobs`
MAX_TOP_LOGPROBS = 20           # chat's `top_logprobs`
UINT64_MAX = 2**64 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    name: str = "schema"
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema", "regex"]
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _needs_its_body(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with a 'schema'")
        if self.type == "regex" and not self.regex:
            raise ValueError("type 'regex' needs a non-empty 'regex' string")
        return self


class SamplingFields(_Strict):
    """The sampling fields both endpoints share."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=0, le=UINT64_MAX)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    response_format: ResponseFormat | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _check_shared(self) -> SamplingFields:
        if self.top_k == 0:
            raise ValueError("top_k: must be -1 (disabled) or >= 1, got 0")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop: stop strings must be non-empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream=true")
        return self

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo: not supported")
        if self.suffix:
            raise ValueError("suffix: not supported")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: must not be an empty list")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt as text or token ids (a batch gives several)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
