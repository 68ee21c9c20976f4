"""Per-request bookkeeping on the Python side: what the user asked for and what was emitted.

The ledger (deepinfer_sched) decides token-level stops (EOS, stop ids, max_tokens); everything
at the text level lives here: incremental detokenization, stop strings, the streaming cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer_engine.outputs import GenerationOutput
from deepinfer_engine.sampling_params import SamplingParams
from deepinfer_engine.stop_strings import StopMatch, StopStringMatcher

FINISH_REASON_ERROR = "error"
LOGPROB_FLOOR = -9999.0


@dataclass
class RequestState:
    request_id: int
    params: SamplingParams
    seed: int                      # resolved uint64 seed (params.seed or drawn from the engine)
    output: GenerationOutput       # grows as tokens arrive
    detokenizer: object | None = None          # IncrementalDetokenizer | GenericDetokenizer
    stops: StopStringMatcher | None = None
    text_sent: int = 0                         # characters of text already streamed
    tokens_sent: int = 0                       # tokens already streamed
    checked_chars: int = 0                     # text already searched for stop strings
    stop_match: StopMatch | None = field(default=None)
    prefill_started: bool = False              # some prefill chunk of it was scheduled (stats: first chunk)

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
            out.token_logprobs.append(max(logprob, LOGPROB_FLOOR))
            if self.num_top_logprobs:
                out.top_logprobs = out.top_logprobs or []
                out.top_logprobs.append(top or {})

    def truncate(self, num_tokens: int) -> int:
        """Keep the first num_tokens output tokens (ids and logprobs together); returns how many were cut."""
        out = self.output
        cut = len(out.token_ids) - num_tokens
        if cut <= 0:
            return 0
        del out.token_ids[num_tokens:]
        if out.token_logprobs is not None:
            del out.token_logprobs[num_tokens:]
        if out.top_logprobs is not None:
            del out.top_logprobs[num_tokens:]
        return cut

    # ------------------------------------------------------------------ text
    def push_text(self, first_new: int) -> int | None:
        """Detokenize output tokens first_new.. one by one; at the first stop string, record the
        match and return how many output tokens to keep (through the token that completed it).
        Stop strings are searched in the text's new tail only (`checked_chars` onwards, plus the
        longest stop string's overlap), never in a copy of the whole text."""
        det = self.detokenizer
        if det is None:
            return None
        ids = self.output.token_ids
        for k in range(first_new, len(ids)):
            det.push(ids[k])
            if self.stops and k + 1 >= self.params.min_tokens:
                lo = max(0, self.checked_chars - self.stops.max_len + 1)
                m = self.stops.find(det.text_since(lo), self.checked_chars - lo)
                self.checked_chars = det.length
                if m is not None:
                    self.stop_match = StopMatch(m.stop, m.start + lo, m.end + lo)
                    return k + 1
            else:
                self.checked_chars = det.length
        return None

    def final_text(self) -> str | None:
        det = self.detokenizer
        if det is None:
            return None
        m = self.stop_match
        if m is None:
            det.finish()
            return det.text
        return det.text[: m.end if self.params.include_stop_str_in_output else m.start]

    def visible_text_since(self, start: int) -> tuple[str, int]:
        """(text that can be streamed now from character `start` on, the streamable length): no
        possible stop-string prefix at the end; read from the detokenizer's tail, not its whole text."""
        det = self.detokenizer
        if det is None:
            return "", 0
        end = det.length
        if self.stops:
            end -= self.stops.holdback(det.text_since(max(0, end - self.stops.max_len + 1)))
        return (det.text_since(start)[: end - start] if end > start else ""), end
