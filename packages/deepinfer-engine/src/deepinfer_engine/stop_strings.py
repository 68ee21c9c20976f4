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

from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    stop: str     # the stop string that matched
    start: int    # character offset of its first character in the text
    end: int      # start + len(stop)


class StopStringMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.max_len = max((len(s) for s in self.stops), default=0)

    def __bool__(self) -> bool:
        return bool(self.stops)

    def find(self, text: str, checked_upto: int) -> StopMatch | None:
        """The earliest stop string that ends after character `checked_upto` (text before it was
        already checked), or None."""
        if not self.stops or len(text) <= checked_upto:
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
        for k in range(min(self.max_len - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0
