"""Which DP rank takes a new request: the lowest `queue depth + KV_WEIGHT x KV use`, then rank id.

Queue depth is the front end's own count of requests sent to a rank and not finished (exact,
no round trip); KV use is the fraction of the rank's KV blocks in use from its latest report.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_engine.parallel.worker import RankLoad

KV_WEIGHT = 4.0   # a fully used KV pool counts like 4 queued requests


def pick_rank(loads: Sequence[RankLoad], outstanding: Sequence[int]) -> int:
    """loads [ranks], outstanding [ranks] -> the rank for the next request."""
    return min(range(len(outstanding)), key=lambda r: (outstanding[r] + KV_WEIGHT * loads[r].kv_used, r))
