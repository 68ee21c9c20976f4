"""ModelRunner: SchedulerOutput -> ForwardMetadata -> model forward -> sampler (-> draft head).

Owns the paged KV cache and, with speculation, the MTP info pool. The scheduler speaks numpy;
the model speaks torch tensors on its device; this file is the only translation between them.

Sampling is one code path: the logits rows of a step are packed by request (`ftp`, `seqlens`
over the logits rows). Prefill samples one row per last-chunk request; decode verifies
`1 + drafts` rows per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_sched import SchedulerOutput, StepKind

from deepinfer_engine.sampler import Sampler, SamplingBatch
from deepinfer_engine.speculation import SpeculativeDecoder


@dataclass
class StepResult:
    """One step's SampledInfo in request order of the SchedulerOutput (host numpy arrays)."""

    token_ids: np.ndarray          # [req_cnt] int32 main token (0 for prefill chunks that do not sample)
    token_logprobs: np.ndarray     # [req_cnt] float32
    verified_token_ids: np.ndarray | None  # [total_q] int32 VERIFIED_END-terminated, None without drafts
    verified_logprobs: np.ndarray | None   # [total_q] float32
    top_logprobs: list[list[dict[int, float]] | None]  # [req_cnt] per emitted token
    num_accepted: np.ndarray | None = None  # [req_cnt] int32 accepted drafts (decode with drafts)
    confidence: np.ndarray | None = None    # [req_cnt, nextn] float32 next step's draft confidences

    @staticmethod
    def empty(req_cnt: int) -> StepResult:
        return StepResult(np.zeros(req_cnt, np.int32), np.zeros(req_cnt, np.float32), None, None, [None] * req_cnt)


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int, nextn: int = 0):
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache = model.allocate_kv_cache(num_blocks, block_size, self.device)
        self.sampler = Sampler()
        self.nextn = nextn
        self.spec = SpeculativeDecoder(model, max_num_seqs, nextn) if nextn > 0 else None
        # Issue 9 hook: (SchedulerOutput, input_ids after draft filling) -> (vocab_mask, row_mask_ids) | None,
        # the structured-output masks of this step's logits rows (set by the engine on the first grammar).
        self.mask_provider = None

    def _tensor(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.array(array, copy=True)).to(device=self.device, dtype=dtype)

    def build_metadata(self, out: SchedulerOutput) -> ForwardMetadata:
        is_prefill = out.step_kind == StepKind.PREFILL
        ftp, seqlens = out.first_token_pos, out.seqlens_q
        if is_prefill:
            logit_rows = (ftp + seqlens - 1)[np.asarray(out.is_last_chunk, dtype=bool)]
        else:
            logit_rows = np.arange(out.total_q)
        return ForwardMetadata(
            input_ids=self._tensor(out.input_token_ids, torch.int64),
            positions=self._tensor(out.positions, torch.int64),
            seqlens_q=self._tensor(seqlens, torch.int32),
            first_token_pos=self._tensor(ftp, torch.int32),
            context_lens=self._tensor(out.context_lens, torch.int32),
            block_tables=self._tensor(out.block_tables, torch.int32),
            slot_mapping=self._tensor(out.slot_mapping, torch.int64),
            block_size=self.block_size,
            is_prefill=is_prefill,
            is_last_chunk=self._tensor(np.asarray(out.is_last_chunk, dtype=bool), torch.bool),
            logit_rows=self._tensor(logit_rows, torch.int64),
            return_dspark_features=self.spec is not None,
        )

    @torch.no_grad()
    def execute(self, out: SchedulerOutput, batch: SamplingBatch) -> StepResult:
        meta = self.build_metadata(out)
        is_prefill = out.step_kind == StepKind.PREFILL
        read_rows = None
        if self.spec is not None and not is_prefill:
            read_rows = self.spec.draft_rows(meta, self._tensor(out.mtp_slots, torch.int32))
            self.spec.fill_draft_inputs(meta, read_rows)
        if bool((meta.input_ids < 0).any()):
            raise RuntimeError("input rows without a token after draft filling (a ZOS step needs the ZOS runner)")
        fwd = self.model.forward(meta, self.kv_cache)
        if self.spec is not None:
            self.model.dspark_write_main_keys(meta, fwd, self.kv_cache)
        # --- issue 9 hook: structured-output masks of the logits rows, applied by the sampler ---
        masks = self.mask_provider(out, meta.input_ids) if self.mask_provider is not None else None

        req_cnt = out.req_cnt
        if is_prefill:  # one logits row per request whose prompt ends in this chunk
            sampled = np.flatnonzero(np.asarray(out.is_last_chunk, dtype=bool))
            if sampled.size == 0:
                return StepResult.empty(req_cnt)
            idx = torch.from_numpy(sampled).to(self.device)
            sub = batch.select(idx, sampled)
            n = sampled.size
            ftp = torch.arange(n, dtype=torch.int32, device=self.device)
            seqlens = torch.ones(n, dtype=torch.int32, device=self.device)
            positions = meta.positions[meta.logit_rows]
            res = self.sampler.sample(fwd.logits, sub, ftp, seqlens, positions, masks=masks)
        else:
            sampled, idx, sub = np.arange(req_cnt), None, batch
            ftp, seqlens, positions = meta.first_token_pos, meta.seqlens_q, meta.positions
            drafts, q = (None, None)
            if read_rows is not None:
                drafts, q = self.spec.verify_inputs(read_rows, need_probs=not bool(batch.is_greedy.all()))
            res = self.sampler.sample(fwd.logits, batch, ftp, seqlens, positions, drafts, q, masks=masks)

        confidence = None
        if self.spec is not None:  # propose the next step's drafts after each request's final row
            final_row = ftp.long() + res.num_accepted.to(self.device).long()
            tables = meta.block_tables if idx is None else meta.block_tables[idx]
            slots = self._tensor(out.mtp_slots[sampled], torch.int32)
            proposal = self.spec.propose(self.kv_cache, positions[final_row], res.token_ids.to(self.device),
                                         tables, self.block_size, sub.seeds, sub.is_greedy, slots)
            confidence = np.zeros((req_cnt, self.nextn), np.float32)
            confidence[sampled] = proposal.confidence.cpu().numpy()

        token_ids = np.zeros(req_cnt, np.int32)
        token_logprobs = np.zeros(req_cnt, np.float32)
        token_ids[sampled] = res.token_ids.numpy()
        token_logprobs[sampled] = res.token_logprobs.numpy()
        top: list[list[dict[int, float]] | None] = [None] * req_cnt
        for j, i in enumerate(sampled):
            top[i] = res.top_logprobs[j]
        has_drafts = not is_prefill and bool((out.seqlens_q > 1).any())
        return StepResult(
            token_ids=token_ids,
            token_logprobs=token_logprobs,
            verified_token_ids=res.verified_token_ids.numpy() if has_drafts else None,
            verified_logprobs=res.verified_logprobs.numpy() if has_drafts else None,
            top_logprobs=top,
            num_accepted=None if is_prefill else res.num_accepted.numpy(),
            confidence=confidence,
        )
