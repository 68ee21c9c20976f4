"""Sequence: the C++ per-request ledger state. Scheduler.get_sequence() returns snapshots of it;
constructing one directly is for unit tests of the counters (advance / commit / recompute)."""

from __future__ import annotations

from collections.abc import Iterable

from . import _core
from .config import RequestParams


class Sequence(_core.Sequence):
    def __init__(self, request_id: int, prompt_token_ids: Iterable[int], params: RequestParams | None = None) -> None:
        super().__init__(request_id, [int(t) for t in prompt_token_ids], (params or RequestParams()).to_core())
