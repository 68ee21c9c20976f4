"""The sampler: logits of the flat rows -> main token per request (+ accepted drafts when speculating).

One code path for every step kind: a request without drafts is a request with seqlen_q = 1.
Sampling distributions come from `probs_from_logits` (temperature / top-k / top-p; greedy rows
one-hot) and every random decision is keyed by (request seed, token position), so a seeded
request samples the same tokens whatever the batch. Reported logprobs are the model's raw
distribution (`log_softmax` of the unprocessed logits), never the truncated sampling one.

Structured output: `masks = (vocab_mask, row_mask_ids)` (packed int32 bitmask, one mask per
constrained row, `NO_VOCAB_MASK` elsewhere) sets forbidden tokens to -inf on the logits *after*
the raw logprobs are taken and *before* the sampling distributions: a forbidden token has
probability 0, so it is never sampled and a draft it forbids is always rejected (greedy: not the
argmax; sampled: U * q(x) < 0 never holds). Reported logprobs stay the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_engine.penalties import PenaltyBatch, apply_penalties, record_emitted
from deepinfer_kernels.ops.sampling.greedy import greedy_pick
from deepinfer_kernels.ops.sampling.logprobs import compute_logprobs
from deepinfer_kernels.ops.sampling.sampling_params import probs_from_logits
from deepinfer_kernels.ops.sampling.vocab_mask import apply_vocab_mask_inplace
from deepinfer_kernels.ops.verification import VERIFIED_END, verify_and_sample
from deepinfer_kernels.ops.verification.verify_and_sample import verify_and_sample_ref


@dataclass
class SamplingHost:
    """The per-request parameters a whole-step decode graph reads, on the host (graph_inputs.py
    stages them with the step's metadata: no copy of their own)."""

    temperature: np.ndarray  # [req_cnt] float32
    seeds: np.ndarray        # [req_cnt] int64

    @staticmethod
    def of(batch: SamplingBatch) -> SamplingHost:
        """From a batch's device tensors (synchronizes: for callers that built no host copy)."""
        return SamplingHost(batch.temperature.cpu().numpy(), batch.seeds.cpu().numpy())


@dataclass
class SamplingBatch:
    """Per-request sampling parameters of one step, on the device, in SchedulerOutput order."""

    temperature: torch.Tensor  # [req_cnt] float32, 0 = greedy
    top_k: torch.Tensor        # [req_cnt] int32, -1 = off
    top_p: torch.Tensor        # [req_cnt] float32, 1.0 = off
    seeds: torch.Tensor        # [req_cnt] int64 (uint64 bits)
    num_top_logprobs: list[int]  # per request: 0 = none
    all_greedy: bool = False   # every request greedy (known on the host: no device sync to ask)
    filters: bool = True       # some request uses top-k or top-p (host fact; False skips those passes)
    needs_masks: bool = False  # some request is grammar-constrained (structured output)
    host: SamplingHost | None = None   # temperature and seeds on the host too (the engine's batches)
    penalties: PenaltyBatch | None = None  # presence / frequency / repetition (penalties.py); None: nobody

    @property
    def is_greedy(self) -> torch.Tensor:  # [req_cnt] bool
        return self.temperature == 0

    def select(self, idx: torch.Tensor, host_idx) -> SamplingBatch:
        """The sub-batch of requests `idx` (device tensor) / `host_idx` (the same, on the host)."""
        return SamplingBatch(self.temperature[idx], self.top_k[idx], self.top_p[idx], self.seeds[idx],
                             [self.num_top_logprobs[int(i)] for i in host_idx], self.all_greedy, self.filters,
                             self.needs_masks,
                             penalties=self.penalties.select(idx) if self.penalties is not None else None)


@dataclass
class SampleResult:
    """One step's sampling decisions, on the device (SampledInfo of docs/design.md). The runner
    copies them to the host asynchronously, so nothing here forces a device sync."""

    token_ids: torch.Tensor           # [req_cnt] int32 main token per request
    token_logprobs: torch.Tensor      # [req_cnt] float32 raw-model logprob of the main token
    verified_token_ids: torch.Tensor  # [num_rows] int32 accepted drafts, VERIFIED_END terminated
    verified_logprobs: torch.Tensor   # [num_rows] float32 raw-model logprob of each accepted draft
    num_accepted: torch.Tensor        # [req_cnt] int32
    final_row: torch.Tensor           # [req_cnt] int32 logits row the main token was drawn at
    top_values: torch.Tensor | None   # [num_rows, n_max] float32 top-n raw logprobs (None: nobody asked)
    top_ids: torch.Tensor | None      # [num_rows, n_max] int64


def _greedy_pick_serves(batch: SamplingBatch, masks: tuple[torch.Tensor, torch.Tensor] | None) -> bool:
    """A step without drafts samples by `greedy_pick` alone: all greedy, no grammar masks, no top
    logprobs asked."""
    return batch.all_greedy and masks is None and not any(batch.num_top_logprobs) and batch.penalties is None


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,           # [num_rows, vocab] rows of the sampled requests, packed by request
        batch: SamplingBatch,
        ftp: torch.Tensor,              # [req_cnt] int32 first logits row of each request
        seqlens_q: torch.Tensor,        # [req_cnt] int32 logits rows per request (1 + drafts)
        positions: torch.Tensor,        # [num_rows] int64 position of each row's input token
        draft_token_ids: torch.Tensor | None = None,  # [num_rows] draft checked at each row
        draft_probs: torch.Tensor | None = None,      # [num_rows, vocab] q of each draft
        masks: tuple[torch.Tensor, torch.Tensor] | None = None,  # (vocab_mask, row_mask_ids): structured output
        checked: bool = True,           # False: the padded graph layout (empty requests), no layout checks
    ) -> SampleResult:
        req_cnt = ftp.shape[0]
        rows = logits.shape[0]
        if draft_token_ids is None and _greedy_pick_serves(batch, masks):
            return self.sample_greedy_without_drafts(logits, ftp, seqlens_q, checked)
        raw = compute_logprobs(logits)  # [num_rows, vocab] float32, before any mask
        row_req = torch.repeat_interleave(torch.arange(req_cnt, device=logits.device), seqlens_q.long(),
                                          output_size=rows)
        if batch.penalties is not None:   # after the raw logprobs, before the grammar masks
            logits = apply_penalties(logits, batch.penalties, row_req, ftp, draft_token_ids)
        if masks is not None:
            apply_vocab_mask_inplace(logits, masks[0], masks[1])
        probs = probs_from_logits(logits, batch.temperature[row_req], batch.top_k[row_req], batch.top_p[row_req],
                                  filters=batch.filters)
        if draft_token_ids is None:
            draft_token_ids = torch.zeros(rows, dtype=torch.int64, device=logits.device)
        verify = verify_and_sample if checked else verify_and_sample_ref
        result = verify(probs, draft_token_ids, draft_probs, batch.seeds, positions, ftp, seqlens_q,
                        batch.is_greedy, batch.all_greedy)
        if batch.penalties is not None:
            record_emitted(batch.penalties, row_req, ftp, result.verified_token_ids, result.num_accepted,
                           result.token_ids)
        final_row = result.final_row.long()
        token_logprobs = raw[final_row, result.token_ids.long()]
        verified = result.verified_token_ids
        accepted = verified != VERIFIED_END
        verified_logprobs = torch.where(
            accepted, raw.gather(1, verified.clamp(min=0).long().unsqueeze(1)).squeeze(1), 0.0)
        top_values = top_ids = None
        if any(batch.num_top_logprobs):
            top_values, top_ids = torch.topk(raw, k=min(max(batch.num_top_logprobs), raw.shape[1]), dim=1)
        return SampleResult(result.token_ids, token_logprobs, verified, verified_logprobs, result.num_accepted,
                            result.final_row, top_values, top_ids)

    def sample_tokens(
        self,
        logits: torch.Tensor,           # [num_rows, vocab] one row per request (no drafts)
        batch: SamplingBatch,
        ftp: torch.Tensor,              # [req_cnt] int32
        seqlens_q: torch.Tensor,        # [req_cnt] int32, each 0 or 1
        positions: torch.Tensor,        # [num_rows] int64
        masks: tuple[torch.Tensor, torch.Tensor] | None = None,
        checked: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(token_ids int32 [req_cnt], token_logprobs float32 [req_cnt]) of a step without drafts:
        what `sample` gives for them. An all-greedy step without masks or top logprobs runs only the
        greedy pick (two launches on SM90): no verification outputs, which a step without drafts
        has no use for (a decode step without speculation)."""
        if _greedy_pick_serves(batch, masks):
            token_ids, token_logprobs, _ = greedy_pick(logits, ftp, seqlens_q, checked)
            return token_ids, token_logprobs
        res = self.sample(logits, batch, ftp, seqlens_q, positions, masks=masks, checked=checked)
        return res.token_ids, res.token_logprobs

    @staticmethod
    def sample_greedy_without_drafts(
        logits: torch.Tensor,       # [num_rows, vocab] float
        ftp: torch.Tensor,          # [req_cnt] int32
        seqlens_q: torch.Tensor,    # [req_cnt] int32, each 0 or 1 (no drafts)
        checked: bool = True,
    ) -> SampleResult:
        """`sample` for an all-greedy step without drafts, grammar masks or top logprobs (plain
        greedy decoding, nextn = 0): each request's token is the argmax of its one logits row, the
        same token and logprob the general path (one-hot distributions, verification of no draft)
        gives, in ~9 kernels instead of ~90 (`greedy_pick`: two on SM90). A request without a row
        (the padded graph layout) reads row 0, as the general path's final row does."""
        req_cnt, rows = ftp.shape[0], logits.shape[0]
        if checked and seqlens_q.device.type == "cpu" and req_cnt and int(seqlens_q.max()) > 1:
            raise ValueError(f"seqlens_q: at most 1 logits row per request without drafts, got {int(seqlens_q.max())}")
        token_ids, token_logprobs, final_row = greedy_pick(logits, ftp, seqlens_q, checked)   # [req_cnt] each
        dev = logits.device
        return SampleResult(token_ids, token_logprobs,
                            torch.full((rows,), VERIFIED_END, dtype=torch.int32, device=dev),
                            torch.zeros(rows, dtype=torch.float32, device=dev),
                            torch.zeros(req_cnt, dtype=torch.int32, device=dev), final_row, None, None)


def top_logprobs_per_request(values: np.ndarray | None, ids: np.ndarray | None, counts: list[int],
                             ftp: np.ndarray, num_accepted: np.ndarray) -> list[list[dict[int, float]] | None]:
    """Host side: per request, {token: logprob} of the top-n alternatives at each emitted row
    (accepted drafts, then the final row), clamped to -9999."""
    out: list[list[dict[int, float]] | None] = []
    for i, n in enumerate(counts):
        if n == 0 or values is None:
            out.append(None)
            continue
        first = int(ftp[i])
        rows = range(first, first + int(num_accepted[i]) + 1)
        out.append([{int(ids[r, k]): max(float(values[r, k]), -9999.0) for k in range(n)} for r in rows])
    return out
