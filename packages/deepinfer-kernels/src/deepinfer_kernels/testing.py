"""Input builders and result checks shared by the TileLang GPU tests, the pytest benchmarks and
``packages/deepinfer-kernels/diag/tilelang_roofline.py`` / ``tools/tilelang_precompile.py``; the timing and roofline helpers
(``tilelang/timing.py``) are re-exported here, so ``testing`` stays the one module those import.

Nothing here imports TileLang; the case builders only need torch (and the references in
``deepinfer_kernels.ops`` for the quantized pools).
"""

import math
from dataclasses import dataclass

import torch

from deepinfer_kernels.tilelang.timing import (  # noqa: F401  (re-exported)
    BF16_FLOPS,
    HBM_BYTES_PER_S,
    IN_GRAPH_COPIES,
    capture_graph,
    cuda_time_us,
    l2_flusher,
    record_benchmark,
    roofline,
)

FP8_REC = 528          # bytes of one D = 512 KV record
FP4_REC = 68           # bytes of one Di = 128 indexer key


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


# ----------------------------------------------------------------------------- sparse MLA


@dataclass
class SparseMLACase:
    q: torch.Tensor          # bf16 [rows, heads, D]
    pool: torch.Tensor       # uint8 [slots, D + D/32]
    indices: torch.Tensor    # int32 [rows, width]
    sm_scale: float

    def gathered_bytes(self) -> int:
        """Bytes the kernel reads and writes if every valid index is fetched once per row."""
        rows, heads, d = self.q.shape
        rec = self.pool.shape[1]
        valid = int((self.indices >= 0).sum())
        return valid * rec + self.q.numel() * 2 * 2 + rows * heads * 4 + self.indices.numel() * 4

    def unique_bytes(self) -> int:
        """Same, counting each distinct slot once (rows that share slots hit L2)."""
        rows, heads, d = self.q.shape
        rec = self.pool.shape[1]
        uniq = int(torch.unique(self.indices[self.indices >= 0]).numel())
        return uniq * rec + self.q.numel() * 2 * 2 + rows * heads * 4 + self.indices.numel() * 4


def make_pool(slots: int, d: int, device, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    from deepinfer_kernels.ops.kv_fp8 import quantize_kv_fp8_ref

    g = _gen(seed)
    pool = torch.empty(slots, d + d // 32, dtype=torch.uint8, device=device)
    chunk = 65536
    for s in range(0, slots, chunk):
        e = min(slots, s + chunk)
        kv = (torch.randn(e - s, d, generator=g) * scale).to(device)
        pool[s:e] = quantize_kv_fp8_ref(kv)
    return pool


def make_sparse_mla_case(rows: int, heads: int, d: int, width: int, slots: int, device, *, seed: int = 0,
                         empty_frac: float = 0.0, ragged: bool = False, empty_rows: tuple[int, ...] = (),
                         duplicates: bool = False, q_scale: float = 1.0, pool: torch.Tensor | None = None,
                         distinct: bool = False, paged: int = 0) -> SparseMLACase:
    """``distinct``: every row reads its own random slots; ``paged`` = B > 0: every row reads
    width / B whole KV blocks of B consecutive slots (the engine's layout), none shared."""
    g = _gen(seed + 1)
    if pool is None:
        pool = make_pool(slots, d, device, seed)
    q = (torch.randn(rows, heads, d, generator=g) * q_scale).to(torch.bfloat16).to(device)
    if paged:
        per_row = width // paged
        if rows * per_row > slots // paged:
            raise ValueError(f"paged={paged}: {rows} rows x {per_row} blocks need more than {slots} slots")
        blocks = torch.randperm(slots // paged, generator=g)[: rows * per_row].view(rows, per_row, 1)
        idx = (blocks * paged + torch.arange(paged)).view(rows, per_row * paged)
    elif distinct:
        idx = torch.stack([torch.randperm(slots, generator=g)[:width] for _ in range(rows)])
    else:
        idx = torch.randint(0, slots, (rows, width), generator=g)
    if duplicates and width >= 4:
        idx[:, 1::4] = idx[:, 0::4][:, : idx[:, 1::4].shape[1]]
    if empty_frac > 0:
        idx[torch.rand(rows, width, generator=g) < empty_frac] = -1
    if ragged:
        lens = torch.randint(0, width + 1, (rows,), generator=g)
        idx[torch.arange(width).unsqueeze(0) >= lens.unsqueeze(1)] = -1
    for r in empty_rows:
        idx[r] = -1
    return SparseMLACase(q, pool, idx.to(torch.int32).to(device), 1.0 / math.sqrt(d))


def make_engine_decode_case(rows: int, heads: int, d: int, window: int, far_blocks: int, block: int, ratio: int,
                            slots: int, device, seed: int = 0, pool: torch.Tensor | None = None,
                            packed: bool = False) -> SparseMLACase:
    """Decode rows laid out as the engine lays them out: ``window`` consecutive slots (the
    window, within one KV block's run), then ``far_blocks`` selected blocks of ``block``
    compressed entries, each entry in its last token's slot, so ``ratio`` slots apart (the
    engine's layout until 2026-12-01), or with ``packed`` in consecutive slots (a KV block's
    entries in its first slots: the engine's layout since, `paged_slots(..., stride=r)`)."""
    g = _gen(seed + 4)
    if pool is None:
        pool = make_pool(slots, d, device, seed)
    span = max(window, block * ratio)
    starts = torch.randperm(slots // span, generator=g)[: rows * (1 + far_blocks)].view(rows, 1 + far_blocks) * span
    win = starts[:, :1] + torch.arange(window)
    step, first = (1, 0) if packed else (ratio, ratio - 1)
    far = (starts[:, 1:, None] + first + step * torch.arange(block)).reshape(rows, far_blocks * block)
    idx = torch.cat([win, far], dim=1)
    q = torch.randn(rows, heads, d, generator=g).to(torch.bfloat16).to(device)
    return SparseMLACase(q, pool, idx.to(torch.int32).to(device), 1.0 / math.sqrt(d))


def make_verify_case(requests: int, rows_per_req: int, heads: int, d: int, window: int, far: int,
                     slots: int, device, seed: int = 0, pool: torch.Tensor | None = None) -> SparseMLACase:
    """Decode with speculative verification: each request owns ``rows_per_req`` consecutive rows
    whose window (``window`` slots ending at the row's position) slides by one token per row and
    whose ``far`` selected compressed entries are shared by the request's rows."""
    g = _gen(seed + 2)
    if pool is None:
        pool = make_pool(slots, d, device, seed)
    rows = requests * rows_per_req
    width = window + far
    idx = torch.empty(rows, width, dtype=torch.int64)
    per_req = slots // requests
    for b in range(requests):
        base = b * per_req
        ctx = torch.randperm(per_req, generator=g)[: window + rows_per_req + far] + base
        far_ids = ctx[window + rows_per_req:]
        for j in range(rows_per_req):
            r = b * rows_per_req + j
            idx[r, :window] = ctx[j: j + window]
            idx[r, window:] = far_ids
    q = torch.randn(rows, heads, d, generator=g).to(torch.bfloat16).to(device)
    return SparseMLACase(q, pool, idx.to(torch.int32).to(device), 1.0 / math.sqrt(d))


def _paged_slots(count: int, paged: int, used: int, slots: int, g) -> torch.Tensor:
    """``count`` slots in the pool's KV-block layout: random blocks of ``paged`` slots, the first
    ``used`` of each taken in order (a block's tokens, or its packed compressed entries)."""
    nblk = -(-count // used)
    starts = torch.randperm(slots // paged, generator=g)[:nblk] * paged
    return (starts.unsqueeze(1) + torch.arange(used)).reshape(-1)[:count]


def make_prefill_case(tokens: int, heads: int, d: int, window: int, far_blocks: int, block: int,
                      slots: int, device, seed: int = 0, pool: torch.Tensor | None = None,
                      prompt_len: int = 0, ratio: int = 4, paged: int = 0) -> SparseMLACase:
    """One prefill chunk: row t sees the window t-window+1..t (slots of consecutive positions) plus
    ``far_blocks`` blocks of ``block`` compressed entries (shared by runs of rows).

    ``prompt_len`` > 0: the engine's layout for prompts of that length (row t at position
    t % prompt_len): window slots before position 0 are -1 (at the front), and a row has only the
    (position + 1 - window) // ratio far entries a ratio-``ratio`` layer has closed, -1 after them.

    ``paged`` > 0: slots as the engine's pool holds them, in KV blocks of ``paged`` slots: positions
    fill a block's slots in order, compressed entries the first ``paged // ratio`` slots of theirs
    (packed). 0: every slot drawn at random (one copy per record for the "bulk" kernels)."""
    g = _gen(seed + 3)
    if pool is None:
        pool = make_pool(slots, d, device, seed)
    if paged:
        pos_slots = _paged_slots(tokens + window, paged, paged, slots, g)
    else:
        pos_slots = torch.randperm(slots, generator=g)[: tokens + window]
    t = torch.arange(tokens).unsqueeze(1)
    win = pos_slots[(t + 1 + torch.arange(window).unsqueeze(0)).clamp(max=tokens + window - 1)]
    if paged:
        comp = _paged_slots(far_blocks * block * 4, paged, paged // ratio, slots, g)
    else:
        comp = torch.randperm(slots, generator=g)[: far_blocks * block * 4]
    sel = torch.stack([torch.randperm(far_blocks * 4, generator=g)[:far_blocks] for _ in range(math.ceil(tokens / 64))])
    far = (sel.unsqueeze(2) * block + torch.arange(block)).reshape(sel.shape[0], -1)
    far = comp[far].repeat_interleave(64, dim=0)[:tokens]
    if prompt_len > 0:
        pos = t % prompt_len                                                     # [tokens, 1]
        win = torch.where(pos - window + 1 + torch.arange(window).unsqueeze(0) >= 0, win, -1)
        n_far = ((pos + 1 - window).clamp(min=0) // ratio).clamp(max=far.shape[1])
        far = torch.where(torch.arange(far.shape[1]).unsqueeze(0) < n_far, far, -1)
    idx = torch.cat([win, far], dim=1)
    q = torch.randn(tokens, heads, d, generator=g).to(torch.bfloat16).to(device)
    return SparseMLACase(q, pool, idx.to(torch.int32).to(device), 1.0 / math.sqrt(d))


# ----------------------------------------------------------------------------- indexer


@dataclass
class IndexerCase:
    q: torch.Tensor          # bf16 [rows, heads, Di]
    weights: torch.Tensor    # fp32 [rows, heads]
    k_pool: torch.Tensor     # uint8 [slots, Di/2 + Di/32]
    indices: torch.Tensor    # int32 [rows, n]
    valid_lens: torch.Tensor  # int32 [rows]


def make_indexer_case(rows: int, heads: int, di: int, n: int, slots: int, device, *, seed: int = 0,
                      empty_frac: float = 0.0, ragged: bool = True) -> IndexerCase:
    from deepinfer_kernels.ops.kv_fp4 import quantize_index_k_fp4_ref

    g = _gen(seed + 4)
    k_pool = quantize_index_k_fp4_ref(torch.randn(slots, di, generator=g).to(device))
    q = torch.randn(rows, heads, di, generator=g).to(torch.bfloat16).to(device)
    w = torch.randn(rows, heads, generator=g).to(device)
    idx = torch.randint(0, slots, (rows, n), generator=g)
    if empty_frac > 0:
        idx[torch.rand(rows, n, generator=g) < empty_frac] = -1
    lens = torch.randint(0, n + 1, (rows,), generator=g) if ragged else torch.full((rows,), n)
    idx[torch.arange(n).unsqueeze(0) >= lens.unsqueeze(1)] = -1
    return IndexerCase(q, w, k_pool, idx.to(torch.int32).to(device), lens.to(torch.int32).to(device))


# ----------------------------------------------------------------------------- MoE


def make_moe_case(tokens: int, hidden: int, inter: int, experts: int, topk: int, device, *, seed: int = 0,
                  skew: float = 0.0):
    """-> (x, weights, ids, w13, w2). ``skew`` > 0 makes the router prefer low expert ids (ragged
    expert sizes, some experts empty)."""
    from deepinfer_kernels.ops.moe import moe_route_ref

    g = _gen(seed + 5)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(device)
    logits = torch.randn(tokens, experts, generator=g) - skew * torch.arange(experts) / experts
    weights, ids = moe_route_ref(logits.to(device), torch.zeros(experts, device=device), topk, True, 2.5)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden ** -0.5).to(torch.bfloat16).to(device)
    w2 = (torch.randn(experts, hidden, inter, generator=g) * inter ** -0.5).to(torch.bfloat16).to(device)
    return x, weights, ids, w13, w2


def moe_active_weight_bytes(ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> int:
    active = int(torch.unique(ids).numel())
    per = (w13[0].numel() + w2[0].numel()) * w13.element_size()
    return active * per


def moe_activation_bytes(tokens: int, topk: int, hidden: int, inter: int) -> int:
    """bf16 activations routed experts move besides the weights: per (token, slot) its input row,
    the gate/up output and the down output; per token the float32 combine."""
    return tokens * topk * (hidden * 2 + inter * 2 * 2 + hidden * 2) + tokens * hidden * 4


def moe_flops(tokens: int, topk: int, hidden: int, inter: int) -> float:
    return 2.0 * tokens * topk * hidden * (2 * inter) + 2.0 * tokens * topk * inter * hidden


def check_sparse_mla(case: SparseMLACase, out: torch.Tensor, lse: torch.Tensor, atol: float = 2e-2,
                     rtol: float = 2e-2) -> None:
    """A sparse MLA result against ``sparse_mla_attention_ref``: dtypes and shapes, rows without a
    valid index give out = 0 and lse = -inf, outputs finite and close, lse close where finite."""
    from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref

    ro, rl = sparse_mla_attention_ref(case.q, case.pool, case.indices, case.sm_scale)
    assert out.dtype == torch.bfloat16 and out.shape == ro.shape
    assert lse.dtype == torch.float32 and lse.shape == rl.shape
    empty = (case.indices < 0).all(dim=1)
    if bool(empty.any()):
        assert bool((out[empty] == 0).all()), "rows without a valid index must give out = 0"
        assert bool((lse[empty] == float("-inf")).all()), "rows without a valid index must give lse = -inf"
    assert bool(torch.isfinite(out.float()).all())
    torch.testing.assert_close(out.float(), ro.float(), atol=atol, rtol=rtol)
    fin = torch.isfinite(rl)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin], rl[fin], atol=2e-3, rtol=1e-4)


def check_close_to_kernel(out: torch.Tensor, lse: torch.Tensor, other_out: torch.Tensor,
                          other_lse: torch.Tensor, lse_atol: float = 1e-4, out_atol: float = 1e-2) -> None:
    """Another kernel's result in another summation order: outputs to bf16 rounding, lse to float32
    (``lse_atol``: wider for a kernel whose scores come from FP8 wgmmas, whose accumulator keeps
    fewer mantissa bits than float32)."""
    torch.testing.assert_close(out.float(), other_out.float(), atol=out_atol, rtol=1e-2)
    fin = torch.isfinite(other_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin], other_lse[fin], atol=lse_atol, rtol=1e-5)
