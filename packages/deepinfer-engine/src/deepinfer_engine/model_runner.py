"""ModelRunner: SchedulerOutput -> ForwardMetadata -> model forward -> sampler -> SampleResult.

Owns the paged KV cache. The scheduler speaks numpy; the model speaks torch tensors on its
device; this file is the only translation between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_sched import SchedulerOutput, StepKind

from deepinfer_engine.sampler import Sampler, SampleResult, SamplingBatch


@dataclass
class StepResult:
    """One step's SampledInfo in request order of the SchedulerOutput (host numpy arrays)."""

    token_ids: np.ndarray          # [req_cnt] int32 main token (0 for prefill chunks that do not sample)
    token_logprobs: np.ndarray     # [req_cnt] float32
    verified_token_ids: np.ndarray | None  # [total_q] int32, None when no request had drafts
    verified_logprobs: np.ndarray | None   # [total_q] float32
    top_logprobs: list[list[dict[int, float]] | None]  # [req_cnt] per emitted token


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int):
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache = model.allocate_kv_cache(num_blocks, block_size, self.device)
        self.sampler = Sampler()

    def _tensor(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.array(array, copy=True)).to(device=self.device, dtype=dtype)

    def build_metadata(self, out: SchedulerOutput) -> ForwardMetadata:
        is_prefill = out.step_kind == StepKind.PREFILL
        input_ids = out.input_token_ids
        if input_ids.size and int(input_ids.min()) < 0:
            raise NotImplementedError("device-filled input rows (speculation / ZOS) need the DSpark runner")
        ftp, seqlens = out.first_token_pos, out.seqlens_q
        if is_prefill:
            last = np.asarray(out.is_last_chunk, dtype=bool)
            logit_rows = (ftp + seqlens - 1)[last]
        else:
            logit_rows = np.arange(out.total_q)
        return ForwardMetadata(
            input_ids=self._tensor(input_ids, torch.int64),
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
        )

    @torch.no_grad()
    def execute(self, out: SchedulerOutput, batch: SamplingBatch) -> StepResult:
        meta = self.build_metadata(out)
        fwd = self.model.forward(meta, self.kv_cache)
        req_cnt = out.req_cnt
        token_ids = np.zeros(req_cnt, dtype=np.int32)
        token_logprobs = np.zeros(req_cnt, dtype=np.float32)
        top: list[list[dict[int, float]] | None] = [None] * req_cnt
        if out.step_kind == StepKind.PREFILL:
            sampled = np.flatnonzero(np.asarray(out.is_last_chunk, dtype=bool))
            if sampled.size == 0:
                return StepResult(token_ids, token_logprobs, None, None, top)
            n = sampled.size
            idx = torch.from_numpy(sampled).to(self.device)
            sub = SamplingBatch(batch.temperature[idx], batch.top_k[idx], batch.top_p[idx], batch.seeds[idx],
                                [batch.num_top_logprobs[i] for i in sampled])
            ones = torch.ones(n, dtype=torch.int32, device=self.device)
            res = self.sampler.sample(fwd.logits, sub, torch.arange(n, dtype=torch.int32, device=self.device),
                                      ones, meta.positions[meta.logit_rows])
            token_ids[sampled] = res.token_ids.numpy()
            token_logprobs[sampled] = res.token_logprobs.numpy()
            for j, i in enumerate(sampled):
                top[i] = res.top_logprobs[j]
            return StepResult(token_ids, token_logprobs, None, None, top)
        res: SampleResult = self.sampler.sample(fwd.logits, batch, meta.first_token_pos, meta.seqlens_q,
                                                meta.positions)
        has_drafts = bool((out.seqlens_q > 1).any())
        return StepResult(
            token_ids=res.token_ids.numpy(),
            token_logprobs=res.token_logprobs.numpy(),
            verified_token_ids=res.verified_token_ids.numpy() if has_drafts else None,
            verified_logprobs=res.verified_logprobs.numpy() if has_drafts else None,
            top_logprobs=res.top_logprobs,
        )
