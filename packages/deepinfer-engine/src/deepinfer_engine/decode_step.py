"""A whole decode step as one capturable function: target forward, sampler, draft head.

`ModelRunner.launch` runs a decode step in one of two ways:

- *piecewise*: the target forward (a CUDA graph or eager), then the sampler and the draft head
  eagerly. Every feature works there: grammar masks, top-n logprobs, top-k / top-p filters.
- *whole step* (`run_decode_step`, replayed from the CUDA graph of the step's bucket): the common
  case of plain temperature / greedy sampling. One replay instead of hundreds of eager launches
  for the sampler and the DSpark draft head, which dominate a small-batch step otherwise.
- *split step* (grammar masks): the bucket's forward graph, then the host builds the masks while
  it runs, then the bucket's tail graph (`run_decode_tail`: sampler with the masks + draft head).

Both compute the same tokens: the same ops in the same order, every random decision keyed by
(seed, position). The function reads the padded layout of cuda_graphs.py (G rows, S = min(G,
max_num_seqs) + 1 request slots: the step's requests, empty requests with seqlen 0, the padding
request last, whose first row `ftp[S - 1]` is where the step's rows end). Padding never leaks into real results:

- rows at or past `ftp[S - 1]` read the MTP padding row (no draft) and sample throw-away tokens;
- empty requests own no rows: the verification ops give them final row 0 and nothing accepted;
- requests other than the step's store their drafts at MTP slot 0 (padding, never verified) and,
  with an all -1 block table, read no DFlash key.
The verification references are called directly: their host-side layout checks (CPU only) reject
empty requests, which exist only here, by construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_engine.sampler import Sampler, SamplingBatch
from deepinfer_kernels.ops.verification import MTP_PADDING_ROW
from deepinfer_kernels.ops.verification.mtp_info import mtp_info_read_rows_ref
from deepinfer_model.metadata import ForwardMetadata


@dataclass
class StepCarry:
    """Zero-overhead scheduling on the device: the previous step's results at fixed addresses
    (each whole step writes its own there at its end) and where this step's rows take them from
    (staged by the host with the step's inputs: graph_inputs.py)."""

    remap: torch.Tensor          # [S] int64 the request's index in the previous step, -1 none
    prev_row: torch.Tensor       # [G] int64 carry index whose token the row takes (its request's first row,
                                 #   token -1), else -1
    row_remap: torch.Tensor      # [G] int64 the row's request's remap (-1: new request, padding)
    row_req: torch.Tensor        # [G] int64 the row's request slot
    token_ids: torch.Tensor      # [max_slots] int64 (or int32) previous step's main token per request
    rejected_rows: torch.Tensor | None  # [max_slots] int64 rows the previous step rejected per request
                                        #   (read only when rows move)
    rows_move: bool = True       # False without speculation: no step rejects rows, only tokens carry over


def carry_row_maps(input_ids: np.ndarray, seqlens_q: np.ndarray, first_token_pos: np.ndarray,
                   remap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step's rows [total_q] -> (row_req, row_remap, prev_row), the host maps `apply_remap` reads:
    each row's request, that request's index in the previous step (-1: none), and for a request's
    first row whose token is still unknown (-1) the previous step's request whose token it takes
    (else -1). Host arrays in SchedulerOutput order (int64 results)."""
    r, t = seqlens_q.shape[0], input_ids.shape[0]
    row_req = np.repeat(np.arange(r, dtype=np.int64), seqlens_q)
    row_remap = np.asarray(remap, np.int64)[row_req]
    first = np.zeros(t, dtype=bool)
    first[first_token_pos[seqlens_q > 0]] = True
    prev_row = np.where(first & (input_ids < 0) & (row_remap >= 0), row_remap, -1).astype(np.int64)
    return row_req, row_remap, prev_row


@dataclass
class DecodeStepInputs:
    """Everything a whole decode step reads (static graph buffers, padded to bucket G)."""

    meta: ForwardMetadata    # decode metadata, G rows, S request slots
    batch: SamplingBatch     # [S] per request; filters off, no top-n logprobs
    mtp_slots: torch.Tensor  # [S] int32 MTP pool slot per request (0 = none: padding)
    # structured output: (vocab_mask [num_masks, W] int32, row_mask_ids [G] int32, -1 = unconstrained)
    masks: tuple[torch.Tensor, torch.Tensor] | None = None
    carry: StepCarry | None = None   # None: the metadata is final (no ZOS fix-up in the step)


@dataclass
class DecodeStepOutputs:
    """Per request [S] / per row [G]; the caller keeps the step's own prefix. Without speculation
    (one row per request, no drafts) nothing is verified, accepted or rejected: those are None."""

    token_ids: torch.Tensor                  # [S] int32 main token
    token_logprobs: torch.Tensor             # [S] float32
    verified_token_ids: torch.Tensor | None  # [G] int32 (VERIFIED_END past the accepted drafts)
    verified_logprobs: torch.Tensor | None   # [G] float32
    num_accepted: torch.Tensor | None        # [S] int32
    confidence: torch.Tensor | None          # [S, nextn] float32 next step's draft confidences
    rejected_rows: torch.Tensor | None       # [S] int64 rows the ledger will not keep (a carry holds it next)


def apply_remap(meta: ForwardMetadata, carry: StepCarry) -> ForwardMetadata:
    """This step's metadata with the previous step's results filled in (ZOS), row by row from the
    host's maps (`carry_row_maps`): a row whose token is last step's takes it; with speculation,
    rows move back by the rows the previous step rejected for their request (positions, slots,
    context). Rows and requests without a previous step keep their values. The one place of these
    rules: the whole-step graph applies it to the padded layout, `ModelRunner.apply_zos_fixup` to
    an eager step's metadata."""
    input_ids = torch.where(carry.prev_row >= 0, carry.token_ids[carry.prev_row.clamp(min=0)], meta.input_ids)
    if not carry.rows_move:
        return dataclasses.replace(meta, input_ids=input_ids)
    row_delta = torch.where(carry.row_remap >= 0, carry.rejected_rows[carry.row_remap.clamp(min=0)], 0)   # [G]
    delta = torch.where(carry.remap >= 0, carry.rejected_rows[carry.remap.clamp(min=0)], 0)               # [S]
    positions = meta.positions - row_delta
    moved = row_delta != 0
    bs = meta.block_size
    # rows that did not move look up block 0 (a padding row's position can lie past the table)
    blocks = meta.block_tables[carry.row_req, torch.where(moved, positions, 0) // bs].long()
    slot_mapping = torch.where(moved, blocks * bs + positions % bs, meta.slot_mapping)
    context_lens = (meta.context_lens.long() - delta).to(torch.int32)
    return dataclasses.replace(meta, input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
                               context_lens=context_lens)


def padded_read_rows(spec, inputs: DecodeStepInputs) -> torch.Tensor:
    """[G] int64 MTP pool row whose draft each row verifies; rows past the step's: the padding row."""
    meta = inputs.meta
    ftp, rows = meta.first_token_pos, meta.total_q
    step_row = torch.arange(rows, device=ftp.device) < ftp[-1].long()
    read_rows = mtp_info_read_rows_ref(inputs.mtp_slots, ftp, meta.seqlens_q, rows, spec.nextn)
    return torch.where(step_row, read_rows, MTP_PADDING_ROW)


def run_decode_tail(cache, spec, sampler: Sampler, inputs: DecodeStepInputs, logits: torch.Tensor,
                    read_rows: torch.Tensor | None) -> DecodeStepOutputs:
    """After the target forward: sampler with verification (and grammar masks), then the draft head.
    logits [G, vocab] (modified in place by the masks); read_rows [G] (None without speculation).
    Runs `spec.compiled_tail` when the speculative part is compiled (SpeculativeDecoder.compile)."""
    tail = decode_tail if spec is None or spec.compiled_tail is None else spec.compiled_tail
    return tail(cache, spec, sampler, inputs, logits, read_rows)


def decode_tail(cache, spec, sampler: Sampler, inputs: DecodeStepInputs, logits: torch.Tensor,
                read_rows: torch.Tensor | None) -> DecodeStepOutputs:
    meta, batch = inputs.meta, inputs.batch
    if spec is None:   # one row per request: the main tokens only (plain greedy: two launches)
        token_ids, token_logprobs = sampler.sample_tokens(logits, batch, meta.first_token_pos, meta.seqlens_q,
                                                          meta.positions, masks=inputs.masks, checked=False)
        return DecodeStepOutputs(token_ids, token_logprobs, None, None, None, None, None)
    drafts, q = spec.verify_inputs(read_rows, need_probs=not batch.all_greedy)
    res = sampler.sample(logits, batch, meta.first_token_pos, meta.seqlens_q, meta.positions, drafts, q,
                         masks=inputs.masks, checked=False)
    final_row = res.final_row.long()
    proposal = spec.propose(cache, meta.positions[final_row], res.token_ids, meta.block_tables,
                            meta.block_size, batch.seeds, batch.is_greedy, batch.all_greedy, inputs.mtp_slots,
                            meta.state_slots)
    rejected = meta.seqlens_q.long() - 1 - res.num_accepted.long()
    return DecodeStepOutputs(res.token_ids, res.token_logprobs, res.verified_token_ids,
                             res.verified_logprobs, res.num_accepted, proposal.confidence, rejected)


def run_decode_step(model, cache, spec, sampler: Sampler, inputs: DecodeStepInputs) -> DecodeStepOutputs:
    """The decode step of `inputs` (no host sync, shapes from G only). With `inputs.carry`: the
    ZOS fix-up first (`apply_remap`), and the step's results into the carry last."""
    carry = inputs.carry
    # input_ids is replaced below: keep the buffers' own views
    meta = apply_remap(inputs.meta, carry) if carry is not None else dataclasses.replace(inputs.meta)
    fixed = dataclasses.replace(inputs, meta=meta)
    read_rows = None
    if spec is not None:
        read_rows = padded_read_rows(spec, fixed)
        spec.fill_draft_inputs(meta, read_rows)
    fwd = model.forward(meta, cache)
    if spec is not None:
        spec.write_main_keys(meta, fwd, cache)
    out = run_decode_tail(cache, spec, sampler, fixed, fwd.logits, read_rows)
    if carry is not None:
        s = out.token_ids.shape[0]
        carry.token_ids[:s].copy_(out.token_ids)
        if carry.rows_move:
            carry.rejected_rows[:s].copy_(out.rejected_rows)
    return out
