"""DSpark speculative decoding in the engine: the MTP info pool between steps and the draft head.

One decode step with speculation (request i has rows ftp[i] .. ftp[i] + seqlen_q[i] - 1)::

    rows of i         g   d0  d1  ...      g = golden token (last committed), dk = draft k from the pool
    pool row read     s*n+0, s*n+1 ...     s = the request's MTP slot, n = nextn
    verify row k      checks draft k (the input token of row k + 1) against the target at row k
    final row         ftp + num_accepted: the main token is sampled there
    draft head        positions p+1 .. p+n after the final row's position p -> store at the slot

Drafts and their distributions q stay on the device in the pool (`MtpInfoPool`, slot 0 =
padding); the CPU only ever decides how many drafts each request verifies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.sampling import RngStream, counter_uniform
from deepinfer_kernels.ops.verification import MtpInfoPool, mtp_info_read_rows, read_mtp_info, store_mtp_info
from deepinfer_model.metadata import DraftMetadata, ForwardMetadata


@dataclass
class DraftProposal:
    """What the draft head produced for one step's sampled requests (kept on the device)."""

    token_ids: torch.Tensor   # [n_req, nextn] int64
    confidence: torch.Tensor  # [n_req, nextn] float32


class SpeculativeDecoder:
    def __init__(self, model, max_num_seqs: int, nextn: int):
        if nextn < 1 or nextn > model.config.nextn:
            raise ValueError(f"nextn: must be in [1, {model.config.nextn}] for this model's draft head, got {nextn}")
        self.model = model
        self.nextn = nextn
        self.pool = MtpInfoPool.allocate(max_num_seqs, nextn, model.device, prob_width=model.config.vocab_size)
        # torch.compile'd speculative parts of the graphed step (`compile`), None = run as written
        self.compiled_tail = None        # decode_step.decode_tail: verification sampler + draft head
        self.compiled_main_keys = None   # model.dspark_write_main_keys

    def compile(self, backend: str | Callable = "inductor") -> None:
        """torch.compile the speculative part of the graphed decode step: the DFlash main keys, the
        verification sampler and the draft head. They are hundreds of small kernels (norms, RoPE, the
        in-block attention, per-position heads, verification index arithmetic) that inductor fuses
        into few; the step is launch-bound at small batch. Shapes follow the bucket (dynamic after the
        second one); the TileLang kernels are custom ops. Not with batch invariance, whose dispatch
        mode wraps the model's entry points."""
        from deepinfer_engine.decode_step import decode_tail

        # Every engine's model is a new guard target for the same code objects: lift dynamo's
        # per-function recompile limit (default 8), or a process with a few engines falls back to eager.
        cfg = torch._dynamo.config
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, limit, max(getattr(cfg, limit), 256))
        self.compiled_tail = torch.compile(decode_tail, fullgraph=True, backend=backend)
        self.compiled_main_keys = torch.compile(_write_main_keys, fullgraph=True, backend=backend)

    def write_main_keys(self, meta: ForwardMetadata, out, cache) -> None:
        """Every DFlash layer's main-token key of the rows the target just processed (optimistic), in
        the graphed decode step: compiled when `compile` ran (eager paths call the model directly)."""
        if self.compiled_main_keys is not None:
            self.compiled_main_keys(self.model, meta, out, cache)
        else:
            self.model.dspark_write_main_keys(meta, out, cache)

    # ------------------------------------------------------------------ before the forward
    def draft_rows(self, meta: ForwardMetadata, mtp_slots: torch.Tensor) -> torch.Tensor:
        """[total_q] int64 pool row whose draft each flat row *verifies* (final rows: padding row)."""
        return mtp_info_read_rows(mtp_slots, meta.first_token_pos, meta.seqlens_q, meta.total_q, self.nextn)

    def fill_draft_inputs(self, meta: ForwardMetadata, read_rows: torch.Tensor) -> None:
        """Input token of local step k >= 1 = draft k - 1 = the draft the previous row verifies."""
        drafts = self.pool.token_ids[read_rows].long()              # [total_q] draft checked at row r
        is_draft_input = meta.input_ids < 0
        shifted = torch.roll(drafts, 1)                             # row r gets the draft of row r - 1
        meta.input_ids = torch.where(is_draft_input, shifted, meta.input_ids)

    def verify_inputs(self, read_rows: torch.Tensor, need_probs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """draft_token_ids [total_q] and their q [total_q, vocab] (None when every request is greedy)."""
        drafts, probs = read_mtp_info(read_rows, self.pool)
        return drafts, (probs if need_probs else None)

    # ------------------------------------------------------------------ after sampling
    def propose(self, cache, final_positions: torch.Tensor, main_tokens: torch.Tensor, block_tables: torch.Tensor,
                block_size: int, seeds: torch.Tensor, is_greedy: torch.Tensor, all_greedy: bool,
                write_slots: torch.Tensor, state_slots: torch.Tensor | None = None) -> DraftProposal:
        """Run the draft head after the final rows and store its nextn drafts at each request's slot.

        final_positions [n] position p of each final row; main_tokens [n] token at p + 1; seeds [n]
        int64; is_greedy [n]; write_slots [n] int32 (0 = do not store); state_slots [n] int32 ring state
        slots (caches with rings: the DFlash main keys live there). Greedy requests take the
        draft head's argmax; sampled requests draw draft j from q_j with the DRAFT stream at the
        position of the token it proposes (p + 2 + j), so drafts are batch-invariant too.
        """
        n = final_positions.shape[0]
        meta = DraftMetadata(positions=final_positions.long(), main_token_ids=main_tokens.long(),
                             block_tables=block_tables, block_size=block_size, state_slots=state_slots)
        uniforms = None
        if n and not all_greedy:
            j = torch.arange(self.model.config.nextn, device=final_positions.device)
            pos = (final_positions.long().unsqueeze(1) + 2 + j).reshape(-1)
            uniforms = counter_uniform(seeds.repeat_interleave(j.numel()), pos, int(RngStream.DRAFT)).reshape(n, -1)
        draft = self.model.dspark_draft(meta, cache, uniforms, greedy=is_greedy)
        tokens = draft.token_ids[:, : self.nextn]
        confidence = draft.confidence[:, : self.nextn].float()
        store_mtp_info(write_slots, tokens, self.pool, confidence=confidence,
                       draft_probs=draft.probs[:, : self.nextn])
        return DraftProposal(tokens, confidence)


def _write_main_keys(model, meta: ForwardMetadata, out, cache) -> None:
    model.dspark_write_main_keys(meta, out, cache)
