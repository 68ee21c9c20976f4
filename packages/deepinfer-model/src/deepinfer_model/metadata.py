"""Typed boundary structs of the engine-path forward: what goes in, what comes out.

Flat rows (`total_q`) hold every token position processed this step; rows of one request are
contiguous; `first_token_pos` (ftp, exclusive prefix sum of `seqlens_q`) is the only bridge
to the request index (`req_cnt`). Slots are `block_id * block_size + offset`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class MetadataError(ValueError):
    """ForwardMetadata / DraftMetadata violates an invariant; the message names the field."""


@dataclass
class ForwardMetadata:
    input_ids: torch.Tensor          # [total_q] int64 token of each row
    positions: torch.Tensor          # [total_q] int64 position of each row
    seqlens_q: torch.Tensor          # [req_cnt] int32 rows per request
    first_token_pos: torch.Tensor    # [req_cnt] int32 exclusive prefix sum of seqlens_q (ftp)
    context_lens: torch.Tensor       # [req_cnt] int32 num_computed_tokens + seqlens_q
    block_tables: torch.Tensor       # [req_cnt, max_blocks] int32, -1 padded (token units)
    slot_mapping: torch.Tensor       # [total_q] int64 slot each row writes (-1 = do not write)
    block_size: int
    is_prefill: bool                 # step kind: prefill chunk(s) or decode (1 + drafts rows)
    is_last_chunk: torch.Tensor      # [req_cnt] bool prefill: the chunk ends the prompt (runs the
                                     #   decoder bounded replay); decode: all true
    logit_rows: torch.Tensor         # [num_logit_rows] int64 flat rows whose logits are returned
    return_dspark_features: bool = False  # return target features of the rows that ran the full stack
    engram_ids: torch.Tensor | None = None  # [total_q] int32 compressed ids; None = model's vocab map

    @property
    def total_q(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_reqs(self) -> int:
        return int(self.seqlens_q.shape[0])

    @property
    def row_to_req(self) -> torch.Tensor:  # [total_q] int64
        return torch.repeat_interleave(torch.arange(self.num_reqs, device=self.seqlens_q.device),
                                       self.seqlens_q.long())

    def validate(self) -> None:
        """Check the ftp bridge and per-row consistency (host sync: call off the hot path)."""
        n, t = self.num_reqs, self.total_q
        for name in ("first_token_pos", "context_lens", "is_last_chunk"):
            if getattr(self, name).shape != (n,):
                raise MetadataError(f"{name}: shape {tuple(getattr(self, name).shape)}, expected ({n},)")
        for name in ("positions", "slot_mapping"):
            if getattr(self, name).shape != (t,):
                raise MetadataError(f"{name}: shape {tuple(getattr(self, name).shape)}, expected ({t},)")
        if self.block_tables.dim() != 2 or self.block_tables.shape[0] != n:
            raise MetadataError(f"block_tables: shape {tuple(self.block_tables.shape)}, expected ({n}, max_blocks)")
        sl, ftp = self.seqlens_q.long(), self.first_token_pos.long()
        if n and (int(ftp[0]) != 0 or bool((ftp[1:] != ftp[:-1] + sl[:-1]).any()) or int(ftp[-1] + sl[-1]) != t):
            raise MetadataError("first_token_pos: must be the exclusive prefix sum of seqlens_q ending at total_q")
        if bool((sl <= 0).any()):
            raise MetadataError("seqlens_q: every request needs >= 1 row")
        start = (self.context_lens.long() - sl)[self.row_to_req]
        local = torch.arange(t, device=self.positions.device) - ftp[self.row_to_req]
        if bool((self.positions.long() != start + local).any()):
            raise MetadataError("positions: row k of request i must be context_lens[i] - seqlens_q[i] + k")
        if not self.is_prefill and not bool(self.is_last_chunk.all()):
            raise MetadataError("is_last_chunk: must be all true in a decode step")
        if self.logit_rows.numel() and (int(self.logit_rows.min()) < 0 or int(self.logit_rows.max()) >= t):
            raise MetadataError("logit_rows: out of range")

    @classmethod
    def build(cls, rows_token_ids: list[list[int]], num_computed: list[int], block_tables: list[list[int]],
              block_size: int, is_prefill: bool, is_last_chunk: list[bool] | None = None,
              logits: str = "last", return_dspark_features: bool = False,
              device: torch.device | str = "cpu") -> ForwardMetadata:
        """Host-side builder (tests, runner): per request its rows' tokens, tokens already cached,
        and block table. `logits`: "last" (last row of each last-chunk request), "all", "none"."""
        n = len(rows_token_ids)
        last = is_last_chunk if is_last_chunk is not None else [True] * n
        seqlens = [len(r) for r in rows_token_ids]
        ftp = [sum(seqlens[:i]) for i in range(n)]
        positions, slots = [], []
        for toks, nc, table in zip(rows_token_ids, num_computed, block_tables, strict=False):
            for k in range(len(toks)):
                p = nc + k
                positions.append(p)
                slots.append(table[p // block_size] * block_size + p % block_size)
        if logits == "all":
            lrows = list(range(sum(seqlens)))
        elif logits == "last":
            lrows = [ftp[i] + seqlens[i] - 1 for i in range(n) if last[i]]
        else:
            lrows = []
        width = max((len(t) for t in block_tables), default=0)
        tables = [list(t) + [-1] * (width - len(t)) for t in block_tables]

        def i32(x):
            return torch.tensor(x, dtype=torch.int32, device=device)

        def i64(x):
            return torch.tensor(x, dtype=torch.long, device=device)

        return cls(
            input_ids=i64([t for r in rows_token_ids for t in r]), positions=i64(positions),
            seqlens_q=i32(seqlens), first_token_pos=i32(ftp),
            context_lens=i32([nc + s for nc, s in zip(num_computed, seqlens, strict=False)]),
            block_tables=i32(tables).reshape(n, width), slot_mapping=i64(slots), block_size=block_size,
            is_prefill=is_prefill, is_last_chunk=torch.tensor(last, dtype=torch.bool, device=device),
            logit_rows=i64(lrows), return_dspark_features=return_dspark_features)


@dataclass
class ForwardOutput:
    logits: torch.Tensor                          # [num_logit_rows, vocab] float32, order of logit_rows
    full_rows: torch.Tensor                       # [n_full] int64 flat rows that ran every layer
    dspark_features: torch.Tensor | None = None   # [n_full, H] target features of full_rows


@dataclass
class DraftMetadata:
    positions: torch.Tensor        # [req_cnt] int64 position p of each request's final row
    main_token_ids: torch.Tensor   # [req_cnt] int64 token sampled from the final row (at p + 1)
    block_tables: torch.Tensor     # [req_cnt, max_blocks] int32 (DFlash main keys live in these slots)
    block_size: int


@dataclass
class DraftOutput:
    token_ids: torch.Tensor        # [req_cnt, nextn] int64 draft j predicts the token at p + 2 + j
    logits: torch.Tensor           # [req_cnt, nextn, vocab] float32 (Markov head included)
    probs: torch.Tensor            # [req_cnt, nextn, vocab] float32 softmax(logits)
    confidence: torch.Tensor       # [req_cnt, nextn] float32 predicted acceptance probability
