"""Typed boundary structs of the engine-path forward: what goes in, what comes out.

Flat rows (`total_q`) hold every token position processed this step; rows of one request are
contiguous; `first_token_pos` (ftp, exclusive prefix sum of `seqlens_q`) is the only bridge
to the request index (`req_cnt`). Slots are `block_id * block_size + offset`.

Decode steps are CUDA-graph capturable: for fixed tensor sizes (total_q, req_cnt, block_tables
width) and a fixed `max_context_len`, every shape of the decode forward is static and nothing
reads tensor values on the host. Graph buckets pad a step with `pad_decode` (the padding
contract; see its docstring and docs/model.md, "Decode: static shapes and graph buckets").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


class MetadataError(ValueError):
    """ForwardMetadata / DraftMetadata violates an invariant; the message names the field."""


@dataclass
class PrefillRowPlan:
    """A prefill step's row sets, from the host (`paged/prefill_plan.py` builds them)."""
    full_rows: torch.Tensor                 # [n_full] int64 rows that run every layer, ascending
    logit_rows_in_full: torch.Tensor        # [num_logit_rows] int64 index of each logit row in full_rows
    closing_rows: dict[int, torch.Tensor]   # ratio > 1 -> [E] int64 rows closing an entry (slot >= 0,
                                            #   position % ratio == ratio - 1), ascending

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> PrefillRowPlan:
        """The plan with `fn` applied to every tensor (e.g. a move to the device)."""
        return PrefillRowPlan(fn(self.full_rows), fn(self.logit_rows_in_full),
                              {r: fn(t) for r, t in self.closing_rows.items()})


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
    max_context_len: int | None = None  # static bound on context_lens (decode: sizes the far-entry
                                        #   candidates); None = block_tables width * block_size
    row_plan: PrefillRowPlan | None = None  # prefill: the step's row sets from the host (no device
                                            #   reads); None = the forward derives them (syncs)
    row_req: torch.Tensor | None = None     # [total_q] int64 each row's request, staged by the host
                                            #   (graph buffers); None = derived from seqlens_q (4 launches)
    logits_every_row: bool = False          # logit_rows is arange(total_q) (a decode step: the runner,
                                            #   graph buffers): the logits read the rows in place, no gather
    state_slots: torch.Tensor | None = None  # [req_cnt] int32 each request's ring state slot (>= 1; 0 =
                                             #   padding): needed by caches with rings (paged/ring.py)

    @property
    def context_bound(self) -> int:
        """Static upper bound on every context length (positions < bound): no tensor is read."""
        if self.max_context_len is not None:
            return int(self.max_context_len)
        return int(self.block_tables.shape[1]) * self.block_size

    @property
    def total_q(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_reqs(self) -> int:
        return int(self.seqlens_q.shape[0])

    @property
    def row_to_req(self) -> torch.Tensor:  # [total_q] int64
        return self.row_req if self.row_req is not None else self._requests_of_rows()

    def _requests_of_rows(self) -> torch.Tensor:  # [total_q] int64, derived from seqlens_q (no sync)
        return torch.repeat_interleave(torch.arange(self.num_reqs, device=self.seqlens_q.device),
                                       self.seqlens_q.long(), output_size=self.total_q)

    def validate(self) -> None:
        """Check the ftp bridge and per-row consistency (host sync: call off the hot path).

        Decode steps may hold requests without rows (`seqlens_q == 0`: graph-bucket padding)."""
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
        if bool((sl < 0).any()) or (self.is_prefill and bool((sl == 0).any())):
            raise MetadataError("seqlens_q: every request needs >= 1 row (decode padding requests: >= 0)")
        req = self._requests_of_rows()
        if self.row_req is not None and (self.row_req.shape != (t,) or self.row_req.dtype != torch.int64
                                         or bool((self.row_req != req).any())):
            raise MetadataError(f"row_req: must be [{t}] int64, each row's request index (seqlens_q repeated)")
        start = (self.context_lens.long() - sl)[req]
        local = torch.arange(t, device=self.positions.device) - ftp[req]
        if bool((self.positions.long() != start + local).any()):
            raise MetadataError("positions: row k of request i must be context_lens[i] - seqlens_q[i] + k")
        if not self.is_prefill and not bool(self.is_last_chunk.all()):
            raise MetadataError("is_last_chunk: must be all true in a decode step")
        if self.logit_rows.numel() and (int(self.logit_rows.min()) < 0 or int(self.logit_rows.max()) >= t):
            raise MetadataError("logit_rows: out of range")
        if self.logits_every_row and not torch.equal(self.logit_rows.long().cpu(), torch.arange(t)):
            raise MetadataError(f"logit_rows: logits_every_row needs logit_rows = arange({t})")
        bound = self.context_bound
        if n and int(self.context_lens.max()) > bound:
            raise MetadataError(f"context_lens: max {int(self.context_lens.max())} exceeds the static bound "
                                f"{bound} (max_context_len / block_tables width * block_size)")
        if self.slot_mapping.numel() and int(self.slot_mapping.min()) < -1:
            raise MetadataError("slot_mapping: slots are >= 0, or -1 (do not write)")
        if self.state_slots is not None and (self.state_slots.shape != (n,) or (n and int(self.state_slots.min()) < 0)):
            raise MetadataError(f"state_slots: must be [{n}] and >= 0 (0 = padding request)")

    def to(self, device: torch.device | str) -> ForwardMetadata:
        """A copy with every tensor on `device`."""
        kw = {f: (v.to(device) if isinstance(v, torch.Tensor) else v) for f, v in self.__dict__.items()}
        if self.row_plan is not None:
            kw["row_plan"] = self.row_plan.map(lambda t: t.to(device))
        return ForwardMetadata(**kw)

    def pad_decode(self, num_rows: int, num_reqs: int | None = None) -> ForwardMetadata:
        """Pad a decode step to a graph bucket of `num_rows` rows and `num_reqs` (default
        `num_rows + 1`) requests, on the device, without a sync. The padding contract:

        - requests `req_cnt .. num_reqs - 2`: no rows (`seqlens_q = 0`, `context_lens = 0`,
          `first_token_pos = total_q`), block table all -1, state slot 0;
        - request `num_reqs - 1` (the padding request) holds rows `total_q .. num_rows - 1`:
          `seqlens_q = context_lens = num_rows - total_q`, `first_token_pos = total_q`,
          positions `0 .. num_rows - total_q - 1`, `input_ids = 0`, `slot_mapping = -1`,
          `engram_ids = -1`, block table all -1, `is_last_chunk = True`;
        - `logit_rows` gets the padding rows appended (`logits_every_row` stays true);
          `max_context_len` is kept (the bound must not change between the batches of one captured
          graph).
        Padding rows produce finite garbage and never write any cache (slot -1 everywhere);
        real rows produce exactly what the unpadded step produces.
        """
        if self.is_prefill:
            raise MetadataError("pad_decode: only decode steps are padded")
        t, r = self.total_q, self.num_reqs
        nr = num_rows + 1 if num_reqs is None else num_reqs
        if num_rows < t or nr < r + 1:
            raise MetadataError(f"pad_decode: bucket ({num_rows} rows, {nr} requests) cannot hold "
                                f"{t} rows and {r} requests plus the padding request")
        dev, pad_rows, extra = self.input_ids.device, num_rows - t, nr - r

        def cat(a: torch.Tensor, fill, n: int) -> torch.Tensor:
            return torch.cat([a, torch.full((n,) + tuple(a.shape[1:]), fill, dtype=a.dtype, device=dev)])

        seqlens, ctx = cat(self.seqlens_q, 0, extra), cat(self.context_lens, 0, extra)
        seqlens[-1] = pad_rows
        ctx[-1] = pad_rows
        ar = torch.arange(pad_rows, device=dev)
        return ForwardMetadata(
            input_ids=cat(self.input_ids, 0, pad_rows),
            positions=torch.cat([self.positions, ar.to(self.positions.dtype)]),
            seqlens_q=seqlens, first_token_pos=cat(self.first_token_pos, t, extra), context_lens=ctx,
            block_tables=cat(self.block_tables, -1, extra), slot_mapping=cat(self.slot_mapping, -1, pad_rows),
            block_size=self.block_size, is_prefill=False, is_last_chunk=cat(self.is_last_chunk, True, extra),
            logit_rows=torch.cat([self.logit_rows, (ar + t).to(self.logit_rows.dtype)]),
            return_dspark_features=self.return_dspark_features,
            engram_ids=None if self.engram_ids is None else cat(self.engram_ids, -1, pad_rows),
            max_context_len=self.context_bound,
            row_req=None if self.row_req is None else cat(self.row_req, nr - 1, pad_rows),
            logits_every_row=self.logits_every_row,
            state_slots=None if self.state_slots is None else cat(self.state_slots, 0, extra))

    @classmethod
    def build(cls, rows_token_ids: list[list[int]], num_computed: list[int], block_tables: list[list[int]],
              block_size: int, is_prefill: bool, is_last_chunk: list[bool] | None = None,
              logits: str = "last", return_dspark_features: bool = False,
              device: torch.device | str = "cpu", state_slots: list[int] | None = None) -> ForwardMetadata:
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
            logit_rows=i64(lrows), return_dspark_features=return_dspark_features,
            logits_every_row=logits == "all", state_slots=None if state_slots is None else i32(state_slots))


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
    valid: torch.Tensor | None = None  # [req_cnt] bool; False = padding request (reads nothing,
                                       #   finite garbage out); None = all valid
    state_slots: torch.Tensor | None = None  # [req_cnt] int32 ring state slots (caches with rings)

    def pad(self, num_reqs: int) -> DraftMetadata:
        """Pad to `num_reqs` requests (graph bucket): padding requests get position 0, main
        token 0, block table all -1 and `valid = False`."""
        r = self.positions.shape[0]
        if num_reqs < r:
            raise MetadataError(f"DraftMetadata.pad: {num_reqs} requests cannot hold {r}")
        dev, extra = self.positions.device, num_reqs - r

        def cat(a: torch.Tensor, fill) -> torch.Tensor:
            return torch.cat([a, torch.full((extra,) + tuple(a.shape[1:]), fill, dtype=a.dtype, device=dev)])

        valid = torch.ones(r, dtype=torch.bool, device=dev) if self.valid is None else self.valid
        return DraftMetadata(positions=cat(self.positions, 0), main_token_ids=cat(self.main_token_ids, 0),
                             block_tables=cat(self.block_tables, -1), block_size=self.block_size,
                             valid=cat(valid, False),
                             state_slots=None if self.state_slots is None else cat(self.state_slots, 0))


@dataclass
class DraftOutput:
    token_ids: torch.Tensor        # [req_cnt, nextn] int64 draft j predicts the token at p + 2 + j
    logits: torch.Tensor           # [req_cnt, nextn, vocab] float32 (Markov head included)
    probs: torch.Tensor            # [req_cnt, nextn, vocab] float32 softmax(logits)
    confidence: torch.Tensor       # [req_cnt, nextn] float32 predicted acceptance probability
