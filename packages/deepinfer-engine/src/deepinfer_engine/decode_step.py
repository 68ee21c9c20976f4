"""A whole decode step as one capturable function: target forward, sampler, draft head.

`ModelRunner.launch` runs a decode step in one of two ways:

- *piecewise*: the target forward (a CUDA graph or eager), then the sampler and the draft head
  eagerly. Every feature works there: grammar masks, top-n logprobs, top-k / top-p filters.
- *whole step* (`run_decode_step`, replayed from the CUDA graph of the step's bucket): the common
  case of plain temperature / greedy sampling. One replay instead of hundreds of eager launches
  for the sampler and the DSpark draft head, which dominate a small-batch step otherwise.

Both compute the same tokens: the same ops in the same order, every random decision keyed by
(seed, position). The function reads the padded layout of cuda_graphs.py (G rows, G + 1
requests: the step's requests, empty requests with seqlen 0, the padding request last, whose
first row `ftp[G]` is where the step's rows end). Padding never leaks into real results:

- rows at or past `ftp[G]` read the MTP padding row (no draft) and sample throw-away tokens;
- empty requests own no rows: the verification ops give them final row 0 and nothing accepted;
- requests other than the step's store their drafts at MTP slot 0 (padding, never verified) and,
  with an all -1 block table, read no DFlash key.
The verification references are called directly: their host-side layout checks (CPU only) reject
empty requests, which exist only here, by construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from deepinfer_engine.sampler import Sampler, SamplingBatch
from deepinfer_kernels.ops.verification import MTP_PADDING_ROW
from deepinfer_kernels.ops.verification.mtp_info import mtp_info_read_rows_ref
from deepinfer_model.metadata import ForwardMetadata


@dataclass
class DecodeStepInputs:
    """Everything a whole decode step reads (static graph buffers, padded to bucket G)."""

    meta: ForwardMetadata    # decode metadata, G rows, G + 1 requests
    batch: SamplingBatch     # [G + 1] per request; filters off, no masks, no top-n logprobs
    mtp_slots: torch.Tensor  # [G + 1] int32 MTP pool slot per request (0 = none: padding)


@dataclass
class DecodeStepOutputs:
    """Per request [G + 1] / per row [G]; the caller keeps the step's own prefix."""

    token_ids: torch.Tensor           # [G + 1] int64 main token
    token_logprobs: torch.Tensor      # [G + 1] float32
    verified_token_ids: torch.Tensor  # [G] int32 (VERIFIED_END past the accepted drafts)
    verified_logprobs: torch.Tensor   # [G] float32
    num_accepted: torch.Tensor        # [G + 1] int32
    confidence: torch.Tensor | None   # [G + 1, nextn] float32 next step's draft confidences


def run_decode_step(model, cache, spec, sampler: Sampler, inputs: DecodeStepInputs) -> DecodeStepOutputs:
    """The decode step of `inputs` (no host sync, shapes from G only)."""
    meta = dataclasses.replace(inputs.meta)   # input_ids is replaced below: keep the buffers' own view
    batch, rows = inputs.batch, meta.total_q
    ftp, seqlens = meta.first_token_pos, meta.seqlens_q
    read_rows = drafts = q = None
    if spec is not None:
        step_row = torch.arange(rows, device=ftp.device) < ftp[-1].long()
        read_rows = mtp_info_read_rows_ref(inputs.mtp_slots, ftp, seqlens, rows, spec.nextn)
        read_rows = torch.where(step_row, read_rows, MTP_PADDING_ROW)
        spec.fill_draft_inputs(meta, read_rows)
    fwd = model.forward(meta, cache)
    if spec is not None:
        model.dspark_write_main_keys(meta, fwd, cache)
        drafts, q = spec.verify_inputs(read_rows, need_probs=True)
    res = sampler.sample(fwd.logits, batch, ftp, seqlens, meta.positions, drafts, q, checked=False)
    confidence = None
    if spec is not None:
        final_row = res.final_row.long()
        proposal = spec.propose(cache, meta.positions[final_row], res.token_ids, meta.block_tables,
                                meta.block_size, batch.seeds, batch.is_greedy, False, inputs.mtp_slots)
        confidence = proposal.confidence
    return DecodeStepOutputs(res.token_ids.long(), res.token_logprobs, res.verified_token_ids,
                             res.verified_logprobs, res.num_accepted, confidence)
