"""How many drafts each request verifies in its next decode step (DSpark variable-length verification).

Fixed mode: every request verifies `nextn` drafts. Variable-length mode (DEEPINFER_ENABLE_MTP_VARLEN):
the CPU fixes only the step's total row budget B and `compute_seqlens_q_by_confidence_rates`
spends it where the draft head's confidences say drafts survive. B maximises expected tokens per
unit of step time under a linear step-time model fitted online from measured decode steps:

    tokens(B) = n + sum of the (B - n) largest gains g[i, j] = c[i, 0] * ... * c[i, j]
    time(B)   = base_ms + slope_ms * B
    B*        = argmax_B tokens(B) / time(B),  B in [n, n * (nextn + 1)]

The line needs steps of different row counts, and a policy that always picks the same B would
never see any (a steady batch at the full budget has one row count): so while the model has no
spread, and every `probe_interval`-th step after, the policy *probes*, spending a budget from a
fixed cycle of fractions of the optional rows instead of B*. A flat slope gives the full budget,
i.e. fixed-length behaviour.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from deepinfer_kernels.ops.verification import compute_seqlens_q_by_confidence_rates


class StepTimeModel:
    """Robust line through the last `window` (rows, ms) decode-step measurements.

    Theil-Sen: the slope is the median of the pairwise slopes, the base the median of
    `ms - slope * rows`. A least-squares line would follow outliers: the first steps of a batch
    include one-off work (a lazily captured CUDA graph, an inductor compile) that costs seconds,
    and one such sample flattened the line to slope 0 for the next 64 steps, so the policy kept
    every draft (what the fourth session measured as "varlen does not pay")."""

    def __init__(self, window: int = 64, min_samples: int = 8, refit_every: int = 8):
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.min_samples = min_samples
        self.refit_every = refit_every   # the policy asks every step: refit after this many new samples
        self._fit: tuple[float, float] | None = None
        self._since_fit = 0

    def add(self, rows: int, ms: float) -> None:
        self.samples.append((rows, ms))
        self._since_fit += 1

    def fit(self) -> tuple[float, float] | None:
        """(base_ms, slope_ms per row), or None until there are enough distinct row counts.
        Recomputed once `refit_every` samples arrived since the last fit (host time per step)."""
        if self._fit is None or self._since_fit >= self.refit_every:
            self._fit, self._since_fit = self._compute(), 0
        return self._fit

    def _compute(self) -> tuple[float, float] | None:
        if len(self.samples) < self.min_samples:
            return None
        x = np.array([s[0] for s in self.samples], dtype=np.float64)
        y = np.array([s[1] for s in self.samples], dtype=np.float64)
        i, j = np.triu_indices(len(x), k=1)
        dx = x[j] - x[i]
        distinct = dx != 0
        if not distinct.any():
            return None
        slope = float(np.median((y[j] - y[i])[distinct] / dx[distinct]))
        base = float(np.median(y - slope * x))
        return max(base, 1e-6), max(slope, 0.0)


def best_budget(gains: np.ndarray, base_ms: float, slope_ms: float) -> int:
    """gains [n, nextn] (cumulative products) -> the row budget B* of the module docstring."""
    n = gains.shape[0]
    sorted_gains = np.sort(gains.reshape(-1))[::-1]
    extra = np.arange(sorted_gains.size + 1)
    tokens = n + np.concatenate([[0.0], np.cumsum(sorted_gains)])
    rate = tokens / (base_ms + slope_ms * (n + extra))
    return n + int(np.argmax(rate))  # argmax takes the smallest budget among equal rates


class VerifyBudgetPolicy:
    PROBE_FRACTIONS = (1.0, 0.5, 0.75, 0.25)   # of the n * nextn optional draft rows

    def __init__(self, nextn: int, varlen: bool, probe_interval: int = 16):
        self.nextn = nextn
        self.varlen = varlen
        self.step_time = StepTimeModel()
        self.probe_interval = probe_interval
        self._plans = 0
        self._probes = 0

    def _probe_budget(self, n: int) -> int:
        frac = self.PROBE_FRACTIONS[self._probes % len(self.PROBE_FRACTIONS)]
        self._probes += 1
        return n + int(round(frac * n * self.nextn))

    def plan(self, confidence: np.ndarray) -> np.ndarray:
        """confidence [n, nextn] of the requests' pending drafts -> drafts to verify [n] int32."""
        n = confidence.shape[0]
        if not self.varlen or n == 0:
            return np.full(n, self.nextn, np.int32)
        conf = np.nan_to_num(confidence.astype(np.float32), nan=0.0).clip(0.0, 1.0)
        fit = self.step_time.fit()
        self._plans += 1
        if fit is None or self._plans % self.probe_interval == 0:
            budget = self._probe_budget(n)
        else:
            budget = best_budget(np.cumprod(conf, axis=1), *fit)
        if budget >= n * (self.nextn + 1):   # every draft: no allocation to compute
            return np.full(n, self.nextn, np.int32)
        seqlens = torch.zeros(n, dtype=torch.int32)
        compute_seqlens_q_by_confidence_rates(budget, torch.arange(n, dtype=torch.int32),
                                              torch.from_numpy(conf), seqlens)
        return seqlens.numpy() - 1
