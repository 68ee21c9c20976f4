"""L2 warm-up of the weight a decode step reads after a latency-bound stretch (`ops.l2_prefetch`).

At batch 1 a layer's big weight reads (q_b, o_proj, the MoE input, the experts) stream at HBM
speed, but between them come chains of small kernels that leave HBM idle: the indexer's scores and
top-k, sparse attention over a few hundred keys and its combine (before o_proj), the experts'
combine and the next layer's norm (before its input projection). `WeightPrefetch.warm` forks side
stream ``prefetch`` at such a point and fetches the head of the weight read next into L2 there, so
those bytes come off the critical path; the weight's kernel finds them in L2.

Where (engine/forward.py): o_proj once the query's q_b GEMM is done (beside the indexer chain and
the attention), the next layer's input projection (or lm_head after the last layer) once the
experts' down GEMM is done (beside the combine). Each warms at most `budget_bytes` (the engine's
`l2_prefetch_mb`; L2 holds ~50 MB on the H200, and what is warmed must still be there when read).

Results do not change: a prefetch reads memory into L2 and writes nothing. It runs only where
the step's side streams do (CUDA decode, `DecodeStreams.enabled`); the stream is joined with the
others at the end of the forward.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.l2_prefetch import l2_prefetch
from deepinfer_model.engine.streams import DecodeStreams


class WeightPrefetch:
    def __init__(self, streams: DecodeStreams, budget_bytes: int):
        self.streams = streams
        self.budget_bytes = budget_bytes
        self.enabled = streams.enabled and budget_bytes > 0

    def warm(self, weight: torch.Tensor) -> None:
        """Fetch the head of `weight` [N, K] into L2 on side stream "prefetch", after everything
        launched so far on the current stream (a no-op where disabled)."""
        if not self.enabled:
            return
        with self.streams.on("prefetch"):
            l2_prefetch(weight, self.budget_bytes)
