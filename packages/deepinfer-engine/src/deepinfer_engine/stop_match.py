"""Where a text-level stop ended a request's text (a stop string, or the end of a code block)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    stop: str     # the stop string that matched
    start: int    # character offset of its first character in the text
    end: int      # start + len(stop)
