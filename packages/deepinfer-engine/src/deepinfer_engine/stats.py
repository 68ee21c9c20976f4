"""Engine counters: what ran, what the prefix cache saved, what speculation accepted."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np


@dataclass
class EngineStats:
    num_steps: int = 0
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    num_prefill_tokens: int = 0          # prompt rows computed (prefix-cache hits excluded)
    num_prefix_cached_tokens: int = 0    # prompt tokens served from the prefix cache
    num_generated_tokens: int = 0
    num_decode_request_steps: int = 0    # (request, decode step) pairs
    num_draft_tokens: int = 0            # drafts verified
    num_accepted_tokens: int = 0         # drafts accepted
    num_preemptions: int = 0             # requests preempted (recompute) when KV blocks ran out
    accepted_per_position: list[int] = field(default_factory=list)  # [nextn] drafts accepted at depth j
    verified_per_position: list[int] = field(default_factory=list)  # [nextn] drafts verified at depth j

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a request gains per decode step: 1 + accepted drafts (before stop truncation)."""
        if not self.num_decode_request_steps:
            return 0.0
        return 1.0 + sum(self.accepted_per_position) / self.num_decode_request_steps

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / v if v else 0.0 for a, v in zip(self.accepted_per_position, self.verified_per_position)]

    def record_prefill(self, num_computed_before: np.ndarray, seqlens_q: np.ndarray, first_chunk: np.ndarray) -> None:
        self.num_prefill_steps += 1
        self.num_prefill_tokens += int(seqlens_q.sum())
        self.num_prefix_cached_tokens += int(num_computed_before[first_chunk].sum())

    def record_speculation(self, num_accepted: np.ndarray, num_drafts: np.ndarray, nextn: int) -> None:
        """One decode step's verification: num_accepted / num_drafts [req_cnt] per request."""
        verified, accepted = acceptance_by_position(num_accepted, num_drafts, nextn)
        if not self.verified_per_position:
            self.verified_per_position, self.accepted_per_position = [0] * nextn, [0] * nextn
        self.verified_per_position = [a + int(b) for a, b in zip(self.verified_per_position, verified)]
        self.accepted_per_position = [a + int(b) for a, b in zip(self.accepted_per_position, accepted)]
        self.num_draft_tokens += int(num_drafts.sum())
        self.num_decode_request_steps += num_drafts.shape[0]


    @classmethod
    def total(cls, parts: list[EngineStats]) -> EngineStats:
        """The counters of several engines (the DP ranks) summed; per-position lists elementwise."""
        out = cls()
        for p in parts:
            for f in dataclasses.fields(cls):
                a, b = getattr(out, f.name), getattr(p, f.name)
                if isinstance(b, list):
                    n = max(len(a), len(b))
                    b = [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
                else:
                    b = a + b
                setattr(out, f.name, b)
        return out


@dataclass
class EngineGauges:
    """What the server's metrics read after a step: queue and KV occupancy, and the counters."""

    num_running: int
    num_waiting: int                 # in the scheduler's queue
    num_held: int                    # waiting for their grammar to compile
    num_blocks: int
    num_free_blocks: int
    num_used_mtp_slots: int
    stats: EngineStats               # the engine's own (LLMEngine.gauges) or a copy (from a DP rank)
    grammar_compiles: list[tuple[float, bool]]   # (seconds, failed) since the previous gauges
    admissions_by_prefix_miss: dict[str, int] = field(default_factory=dict)   # PrefixMiss name -> admissions

    @classmethod
    def total(cls, parts: list[EngineGauges]) -> EngineGauges:
        """Several engines' gauges (the DP ranks) as one."""
        return cls(*(sum(getattr(p, name) for p in parts) for name in
                     ("num_running", "num_waiting", "num_held", "num_blocks", "num_free_blocks",
                      "num_used_mtp_slots")),
                   EngineStats.total([p.stats for p in parts]), [c for p in parts for c in p.grammar_compiles],
                   {k: sum(p.admissions_by_prefix_miss.get(k, 0) for p in parts)
                    for k in {k for p in parts for k in p.admissions_by_prefix_miss}})


def acceptance_by_position(num_accepted: np.ndarray, num_drafts: np.ndarray,
                           nextn: int) -> tuple[np.ndarray, np.ndarray]:
    """Per draft depth j: how many requests verified a draft at j, and how many accepted it."""
    j = np.arange(nextn)
    verified = (num_drafts[:, None] > j).sum(0)
    accepted = (num_accepted[:, None] > j).sum(0)
    return verified, accepted
