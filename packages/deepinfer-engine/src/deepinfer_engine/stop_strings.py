"""Stop strings, matched on the detokenized text across token boundaries.

A stop string finishes the request at the first token whose text *completes* it (the earliest
end; ties: the longest match). That token is the last one kept in `token_ids` / logprobs; the
text is cut at the start of the stop string (or after it with `include_stop_str_in_output`).
Tokens after it (e.g. the rest of an accepted draft block) are never emitted.

For streaming, `holdback(text)` is the length of the longest tail of the text that is a proper
prefix of some stop string: that tail is not shown until the next token decides whether it is
the start of a stop string.
"""

from __future__ import annotations

from deepinfer_engine.function_end import WINDOW, FunctionEndRule
from deepinfer_engine.stop_match import StopMatch

__all__ = ["StopMatch", "StopStringMatcher", "make_stop_matcher"]


class StopStringMatcher:
    """The stop strings of one request, plus optionally the end of the code block its prompt
    opens (`FunctionEndRule`, SamplingParams.stop_at_function_end): whichever ends first wins."""

    def __init__(self, stops: list[str], function_end=None):
        self.stops = [s for s in stops if s]
        self.function_end = function_end      # FunctionEndRule | None
        self.max_len = max([len(s) for s in self.stops] + ([WINDOW + 2] if function_end is not None else []),
                           default=0)

    def __bool__(self) -> bool:
        return bool(self.stops) or self.function_end is not None

    def find(self, text: str, checked_upto: int) -> StopMatch | None:
        """The earliest stop string that ends after character `checked_upto` (text before it was
        already checked), or None."""
        if len(text) <= checked_upto:
            return None
        best = self._find_strings(text, checked_upto)
        if self.function_end is not None:
            m = self.function_end.find(text, checked_upto)
            if m is not None and (best is None or (m.end, m.start) < (best.end, best.start)):
                best = m
        return best

    def _find_strings(self, text: str, checked_upto: int) -> StopMatch | None:
        if not self.stops:
            return None
        lo = max(0, checked_upto - self.max_len + 1)
        best: StopMatch | None = None
        for s in self.stops:
            i = text.find(s, lo)
            while i >= 0 and i + len(s) <= checked_upto:  # ended inside already-checked text
                i = text.find(s, i + 1)
            if i < 0:
                continue
            m = StopMatch(s, i, i + len(s))
            if best is None or (m.end, m.start) < (best.end, best.start):
                best = m
        return best

    def holdback(self, text: str) -> int:
        """Characters at the end of `text` that could still become a stop string."""
        held = self.function_end.holdback(text) if self.function_end is not None else 0
        longest = max((len(s) for s in self.stops), default=0)
        for k in range(min(longest - 1, len(text)), held, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return held


def make_stop_matcher(params, prompt: str | None, prompt_token_ids: list[int], tokenizer) -> StopStringMatcher | None:
    """The text-level stop matcher of a request (None when it has no text-level stop)."""
    rule = None
    if params.stop_at_function_end:
        text = prompt if prompt is not None else tokenizer.decode(prompt_token_ids)
        rule = FunctionEndRule.for_prompt(text)
    if not params.stop and rule is None:
        return None
    return StopStringMatcher(params.stop, rule)
