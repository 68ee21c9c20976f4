"""Per-request bookkeeping on the Python side: what the user asked for and what was emitted."""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_engine.outputs import GenerationOutput
from deepinfer_engine.sampling_params import SamplingParams

FINISH_REASON_ERROR = "error"


@dataclass
class RequestState:
    request_id: int
    params: SamplingParams
    seed: int                      # resolved uint64 seed (params.seed or drawn from the engine)
    output: GenerationOutput       # grows as tokens arrive

    @property
    def wants_logprobs(self) -> bool:
        return self.params.logprobs is not None

    @property
    def num_top_logprobs(self) -> int:
        return self.params.logprobs or 0

    def append(self, token_id: int, logprob: float, top: dict[int, float] | None) -> None:
        out = self.output
        out.token_ids.append(token_id)
        if self.wants_logprobs:
            out.token_logprobs = out.token_logprobs or []
            out.token_logprobs.append(logprob)
            if self.num_top_logprobs:
                out.top_logprobs = out.top_logprobs or []
                out.top_logprobs.append(top or {})
