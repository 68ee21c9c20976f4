"""Presence, frequency and repetition penalties, on the logits' device, vectorised over the batch.

Per request the device keeps a row of a `PenaltyTable`: output token counts [vocab] int32 and a
prompt-token mask [vocab] bool. For a logits row r of request i (OpenAI / vLLM semantics)::

    c      = counts[i] + drafts before r in i's verification block      (output tokens so far)
    seen   = c > 0  |  prompt_mask[i]
    l      = where(seen, where(l > 0, l / repetition, l * repetition), l)
    l      = l - frequency * c - presence * (c > 0)

Speculative verification rows: row j of a block (drafts d0 .. d(j-1) before it) sees those drafts
as output tokens, so the verified distribution at every row is exactly what plain decoding would
have seen after accepting them; greedy speculation with penalties equals greedy decoding with
them. After verification the emitted tokens (accepted drafts + main token) are added to the
counts on the device (`record_emitted`), in stream order, so a ZOS step launched next reads them.

Row 0 of the table is the padding slot of requests without penalties (coefficients 0 / 1 leave
their logits bit-identical; nothing is recorded there). Known limit: a ZOS step whose results
the ledger discards (its request was preempted while it was in flight) has already counted its
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NO_PENALTY_SLOT = 0


@dataclass
class PenaltyBatch:
    """One step's penalty parameters, per request of the sampled batch (SchedulerOutput order)."""

    table: PenaltyTable
    slots: torch.Tensor        # [req_cnt] int64 table row, NO_PENALTY_SLOT = none
    presence: torch.Tensor     # [req_cnt] float32
    frequency: torch.Tensor    # [req_cnt] float32
    repetition: torch.Tensor   # [req_cnt] float32 (1 = off)

    def select(self, idx: torch.Tensor) -> PenaltyBatch:
        return PenaltyBatch(self.table, self.slots[idx], self.presence[idx], self.frequency[idx],
                            self.repetition[idx])


class PenaltyTable:
    """Device rows of output-token counts and prompt masks; grows when every slot is taken."""

    def __init__(self, vocab_size: int, device: torch.device, num_slots: int = 16):
        self.vocab_size, self.device = vocab_size, device
        self.counts = torch.zeros(num_slots + 1, vocab_size, dtype=torch.int32, device=device)   # [slots, vocab]
        self.prompt_mask = torch.zeros(num_slots + 1, vocab_size, dtype=torch.bool, device=device)
        self._free = list(range(num_slots, 0, -1))
        self.slot_of: dict[int, int] = {}

    def assign(self, request_id: int, prompt_token_ids: list[int]) -> int:
        if not self._free:
            n = self.counts.shape[0]
            self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
            self.prompt_mask = torch.cat([self.prompt_mask, torch.zeros_like(self.prompt_mask)])
            self._free = list(range(2 * n - 1, n - 1, -1))
        slot = self._free.pop()
        self.counts[slot].zero_()
        self.prompt_mask[slot].zero_()
        ids = torch.tensor(prompt_token_ids, dtype=torch.int64, device=self.device)
        self.prompt_mask[slot, ids] = True
        self.slot_of[request_id] = slot
        return slot

    def release(self, request_id: int) -> None:
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def batch(self, request_ids, params) -> PenaltyBatch | None:
        """The step's PenaltyBatch (None when no request of it has penalties). `params[i]` is the
        SamplingParams of request_ids[i] (None for a request that already finished)."""
        slots = [self.slot_of.get(int(r), NO_PENALTY_SLOT) for r in request_ids]
        if not any(slots):
            return None
        p = [x if x is not None and s else None for x, s in zip(params, slots)]
        host = torch.tensor([[s, x.presence_penalty if x else 0.0, x.frequency_penalty if x else 0.0,
                              x.repetition_penalty if x else 1.0] for s, x in zip(slots, p)], dtype=torch.float64)
        dev = host.to(self.device)
        return PenaltyBatch(self, dev[:, 0].long(), dev[:, 1].float(), dev[:, 2].float(), dev[:, 3].float())


def _draft_counts(rows: int, vocab: int, draft_token_ids: torch.Tensor, ftp: torch.Tensor,
                  row_req: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] int32: per row, how often each token occurs among the drafts verified at the
    earlier rows of its own request's block (the tokens the row's input already contains)."""
    onehot = torch.zeros(rows, vocab, dtype=torch.int32, device=draft_token_ids.device)
    onehot.scatter_(1, draft_token_ids.long().clamp(0, vocab - 1).unsqueeze(1), 1)
    before = onehot.cumsum(0, dtype=torch.int32) - onehot           # drafts at rows < r (all requests)
    return before - before[ftp.long()[row_req]]                      # ... minus those before the block


def apply_penalties(
    logits: torch.Tensor,          # [rows, vocab] the sampled rows, packed by request
    pen: PenaltyBatch,
    row_req: torch.Tensor,         # [rows] int64 request of each row
    ftp: torch.Tensor,             # [req_cnt] int32 first row of each request
    draft_token_ids: torch.Tensor | None = None,  # [rows] draft verified at each row (None: no drafts)
) -> torch.Tensor:
    """Penalised logits [rows, vocab] float32 (a new tensor)."""
    rows, vocab = logits.shape
    slot = pen.slots[row_req]
    counts = pen.table.counts[slot]                                  # [rows, vocab] int32
    if draft_token_ids is not None:
        counts = counts + _draft_counts(rows, vocab, draft_token_ids, ftp, row_req)
    seen = (counts > 0) | pen.table.prompt_mask[slot]
    x = logits.float()
    rep = pen.repetition[row_req].unsqueeze(1)
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    return x - pen.frequency[row_req].unsqueeze(1) * counts - pen.presence[row_req].unsqueeze(1) * (counts > 0)


def record_emitted(
    pen: PenaltyBatch,
    row_req: torch.Tensor,         # [rows] int64
    ftp: torch.Tensor,             # [req_cnt] int32
    verified_token_ids: torch.Tensor,  # [rows] int32 accepted drafts (the first num_accepted of each block)
    num_accepted: torch.Tensor,    # [req_cnt] int32
    token_ids: torch.Tensor,       # [req_cnt] int32 main token
) -> None:
    """Add each request's emitted tokens (accepted drafts, then the main token) to its counts."""
    counts = pen.table.counts
    local = torch.arange(row_req.shape[0], device=row_req.device) - ftp.long()[row_req]
    slots = pen.slots[row_req]
    keep = (local < num_accepted.long()[row_req]) & (slots != NO_PENALTY_SLOT)
    # masked adds instead of boolean indexing: no device -> host sync for the number of tokens
    counts.index_put_((slots, verified_token_ids.long().clamp(min=0)), keep.to(torch.int32), accumulate=True)
    live = (pen.slots != NO_PENALTY_SLOT).to(torch.int32)
    counts.index_put_((pen.slots, token_ids.long()), live, accumulate=True)


def apply_penalties_ref(logits: torch.Tensor, output_ids: list[int], prompt_ids: list[int], presence: float,
                        frequency: float, repetition: float) -> torch.Tensor:
    """One row [vocab], one token at a time in Python (the reference the tests compare against)."""
    x = logits.float().clone()
    counts: dict[int, int] = {}
    for t in output_ids:
        counts[t] = counts.get(t, 0) + 1
    for t in set(output_ids) | set(prompt_ids):
        x[t] = x[t] / repetition if x[t] > 0 else x[t] * repetition
    for t, c in counts.items():
        x[t] -= frequency * c + presence
    return x
