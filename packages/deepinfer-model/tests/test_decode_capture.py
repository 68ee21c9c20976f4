"""The decode step is CUDA-graph capturable (checked on the CPU):

1. graph-bucket padding (`ForwardMetadata.pad_decode`, `DraftMetadata.pad`) changes nothing for
   the real rows / requests and writes nothing for the padding rows;
2. the CUDA code path (`force_capturable()`) issues no host-sync op and no data-dependent shape;
3. every op shape depends only on the metadata sizes (two batches, one op/shape trace);
4. dynamo traces the decode forward, the main-key write and the draft forward with
   `fullgraph=True` and no scalar capture (a graph break or `.item()` fails), and a second
   batch of the same sizes does not recompile.
The CUDA-graph replay itself is checked in test_decode_cuda_graph.py (gpu).
"""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer_kernels.ops.capture import force_capturable
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import tiny
from deepinfer_model.testing import Driver, Seq, caches_equal, clone_cache, tiny_model

PROMPTS = (40, 9, 23, 17, 30, 5, 12, 33, 26, 8, 19, 44, 16, 21, 3, 37) * 2   # 32 requests
DRAFTS = (0, 1, 2, 1) * 8     # 32 drafts: 64 rows per step (rotated each step)
MAX_BLOCKS = 12               # block table width: static context bound 96 tokens (block size 8)
BUCKET_ROWS = 96              # 32 padding rows: positions past the window, far entries on -1 tables


class RowwiseMatmul(TorchDispatchMode):
    """Every mm / addmm / _grouped_mm computed one row at a time (M = 1).

    CPU kernels are not batch-invariant, so a padded step would differ from the unpadded one by
    rounding alone (~1e-7, then an FP8 rounding flip in the cache):
    - BLAS: a row's result depends on how many rows share the GEMM (gemv / small-M kernels,
      remainder blocks; observed on the Engram gate mm). This mode computes each row with the same
      M = 1 call in both runs.
    - vectorised transcendentals (sigmoid, exp, ...) round differently in the scalar tail of a
      tensor (ATen's loops step by 2 vectors: 32 floats on AVX-512). The real batch has 32
      requests and 64 rows, so every per-row / per-request float tensor of the real rows fills
      whole steps in both runs (the padding comes after them).
    Any remaining difference is a padding leak."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.mm.default and args[0].shape[0] > 1:
            a, b = args
            return torch.cat([torch.mm(a[i:i + 1], b) for i in range(a.shape[0])])
        if func is aten.addmm.default and args[1].shape[0] > 1:
            bias, a, b = args
            return torch.cat([torch.addmm(bias, a[i:i + 1], b, **kwargs) for i in range(a.shape[0])])
        if func is aten._grouped_mm.default and args[0].dim() == 2 and args[1].dim() == 3:
            a, b, offs = args[0], args[1], kwargs.get("offs", args[2] if len(args) > 2 else None)
            group = torch.searchsorted(offs.long(), torch.arange(a.shape[0]), right=True).tolist()
            out = torch.zeros(a.shape[0], b.shape[2], dtype=a.dtype)
            for i, e in enumerate(group):
                if e < b.shape[0]:
                    out[i] = torch.mm(a[i:i + 1], b[e])[0]
            return out
        return func(*args, **kwargs)


def _setup(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in PROMPTS]
    drv = Driver(model, num_blocks=200, block_size=8, shuffle_seed=seed)
    meta, out = drv.prefill(seqs, list(PROMPTS), features=True)
    model.dspark_write_main_keys(meta, out, drv.cache)
    for s, lg in zip(seqs, out.logits, strict=True):
        s.tokens.append(int(lg.argmax()))
    return drv, seqs, g


def _drafts(seqs, g, step):
    counts = DRAFTS[step % len(DRAFTS):] + DRAFTS[: step % len(DRAFTS)]
    return [[int(t) for t in torch.randint(4, 8192, (c,), generator=g)] for c in counts[: len(seqs)]]


@pytest.mark.parametrize("capturable", [False, True], ids=["reference-path", "cuda-path"])
def test_padded_decode_equals_unpadded(capturable):
    model = tiny_model()
    ctx = force_capturable() if capturable else contextlib.nullcontext()
    drv, seqs, g = _setup(model)
    with ctx, RowwiseMatmul():
        for step in range(2):
            meta = drv.decode_meta(seqs, _drafts(seqs, g, step), features=True, max_blocks=MAX_BLOCKS)
            t, r = meta.total_q, meta.num_reqs
            padded = meta.pad_decode(BUCKET_ROWS)
            padded.validate()
            assert padded.num_reqs == BUCKET_ROWS + 1 and padded.total_q == BUCKET_ROWS
            ca, cb = clone_cache(drv.cache), clone_cache(drv.cache)
            a = model.forward(meta, ca)
            model.dspark_write_main_keys(meta, a, ca)
            b = model.forward(padded, cb)
            model.dspark_write_main_keys(padded, b, cb)
            assert torch.equal(a.logits, b.logits[:t]) and torch.equal(a.dspark_features, b.dspark_features[:t])
            assert bool(b.logits.isfinite().all()) and bool(b.dspark_features.isfinite().all())
            assert caches_equal(ca, cb), "padding rows wrote a cache"
            # draft forward: padded requests (valid = False) next to the real ones
            ftp = meta.first_token_pos.long()
            mains = [int(x) for x in a.logits[ftp].argmax(-1)]        # every draft rejected
            dm = drv.draft_meta(seqs, mains, max_blocks=MAX_BLOCKS)
            dp = dm.pad(BUCKET_ROWS + 1)
            uni = torch.rand(BUCKET_ROWS + 1, model.config.nextn, generator=g)
            greedy = torch.arange(BUCKET_ROWS + 1) % 2 == 0
            da = model.dspark_draft(dm, ca, uni[:r], greedy[:r])
            db = model.dspark_draft(dp, cb, uni, greedy)
            for f in ("token_ids", "logits", "probs", "confidence"):
                assert torch.equal(getattr(da, f), getattr(db, f)[:r]), f
                assert bool(getattr(db, f).float().isfinite().all()), f
            # an all -1 block table is the same as valid = False
            dp.valid = None
            assert torch.equal(model.dspark_draft(dp, cb, uni, greedy).logits[:r], da.logits)
            assert caches_equal(ca, cb)
            drv.cache = ca
            for s, m in zip(seqs, mains, strict=True):
                s.tokens.append(m)


def test_capturable_path_equals_reference_path():
    """The CUDA code path (sync-free writes, grouped-GEMM MoE, static compressor) on the CPU gives
    bit-identical results to the CPU reference path."""
    model = tiny_model()
    runs = []
    for capturable in (False, True):
        with force_capturable(capturable):
            drv, seqs, g = _setup(model, seed=3)
            outs = []
            for step in range(2):
                meta = drv.decode_meta(seqs, _drafts(seqs, g, step), features=True).pad_decode(BUCKET_ROWS)
                out = model.forward(meta, drv.cache)
                model.dspark_write_main_keys(meta, out, drv.cache)
                mains = [int(x) for x in out.logits[meta.first_token_pos[: len(seqs)].long()].argmax(-1)]
                d = model.dspark_draft(drv.draft_meta(seqs, mains).pad(BUCKET_ROWS + 1), drv.cache)
                outs += [out.logits, out.dspark_features, d.logits, d.confidence]
                for s, m in zip(seqs, mains, strict=True):
                    s.tokens.append(m)
            runs.append((outs, drv.cache))
    (ref, cref), (got, cgot) = runs
    assert all(torch.equal(x, y) for x, y in zip(ref, got, strict=True))
    assert caches_equal(cref, cgot)


# ---------------------------------------------------------------- host syncs and static shapes

_SYNC_OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.bincount", "aten.unique",
             "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive", "aten.lift_fresh",
             "aten.lift_fresh_copy", "aten.item", "aten.is_nonzero"}
_INDEX_OPS = {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}


class OpTrace(TorchDispatchMode):
    """Records (op, output shapes) and flags ops that sync the host or have data-dependent shapes:
    `.item()`/`int()`/`bool()` (_local_scalar_dense), nonzero, boolean-mask indexing, bincount,
    unique, repeat_interleave without output_size, constant tensors from Python lists (lift_fresh:
    a host->device copy on CUDA). `.tolist()` bypasses the dispatcher; dynamo catches it below."""

    def __init__(self):
        super().__init__()
        self.ops, self.bad = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if name in _SYNC_OPS:
            self.bad.append(name)
        if name in _INDEX_OPS:
            idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in idx):
                self.bad.append(f"{name} with a boolean mask")
        if name == "aten.repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
            self.bad.append("repeat_interleave without output_size")
        out = func(*args, **kwargs)
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((name, tuple(tuple(o.shape) for o in flat if isinstance(o, torch.Tensor))))
        return out


def _traced_step(model, drv, seqs, drafts, uniforms):
    meta = drv.decode_meta(seqs, drafts, features=True, max_blocks=MAX_BLOCKS).pad_decode(BUCKET_ROWS)
    dm = drv.draft_meta(seqs, [7] * len(seqs), max_blocks=MAX_BLOCKS).pad(BUCKET_ROWS + 1)
    greedy = torch.arange(BUCKET_ROWS + 1) % 3 == 0
    trace = OpTrace()
    with force_capturable(), trace:
        out = model.forward(meta, drv.cache)
        model.dspark_write_main_keys(meta, out, drv.cache)
        model.dspark_draft(dm, drv.cache, uniforms, greedy)
    return trace


def test_decode_step_has_no_sync_and_static_shapes():
    model = tiny_model()
    drv, seqs, g = _setup(model)
    uni = torch.rand(BUCKET_ROWS + 1, model.config.nextn, generator=g)
    t1 = _traced_step(model, drv, seqs, _drafts(seqs, g, 0), uni)
    assert not t1.bad, f"host syncs / data-dependent shapes in the decode step: {sorted(set(t1.bad))}"
    # another batch of the same bucket: other requests, other draft counts, other contexts
    for s in seqs:
        s.tokens.append(5)
    t2 = _traced_step(model, drv, seqs[1:] + seqs[:1], _drafts(seqs, g, 1)[::-1], uni)
    assert not t2.bad
    assert t1.ops == t2.ops, "an op shape depends on tensor values"
    assert any(op == "aten._grouped_mm" for op, _ in t1.ops)         # the CUDA MoE path ran


# ---------------------------------------------------------------- dynamo (fullgraph) check


def _bf16_tiny():
    torch.manual_seed(0)   # nextn 2 instead of 5: the same code, a shorter trace (~10 s on 2 cores)
    return V41ForCausalLM(tiny().replace(nextn=2), dtype=torch.bfloat16).init_random_weights(0).eval()


def test_decode_step_traces_with_dynamo_fullgraph():
    """`torch.compile(fullgraph=True, backend="eager")`: dynamo only, no inductor. A graph break
    (data-dependent Python control flow, `.item()` / `.tolist()` with capture_scalar_outputs off,
    a data-dependent output shape) raises. bf16 model: the meta kernel of `torch._grouped_mm` (the
    CUDA MoE path) accepts bf16 only; every other op is the same code at any dtype."""
    import torch._dynamo as dynamo

    model = _bf16_tiny()
    drv, seqs, g = _setup(model)
    nextn = model.config.nextn

    def step(cache, meta, dmeta, uniforms, greedy):
        out = model.forward(meta, cache)
        model.dspark_write_main_keys(meta, out, cache)
        d = model.dspark_draft(dmeta, cache, uniforms, greedy)
        return out.logits, out.dspark_features, d.token_ids, d.logits, d.confidence

    def batch(order, draft_step):
        ss = [seqs[i] for i in order]
        meta = drv.decode_meta(ss, _drafts(ss, g, draft_step), features=True, max_blocks=MAX_BLOCKS)
        dm = drv.draft_meta(ss, [7] * len(ss), max_blocks=MAX_BLOCKS).pad(BUCKET_ROWS + 1)
        return (meta.pad_decode(BUCKET_ROWS), dm, torch.rand(BUCKET_ROWS + 1, nextn, generator=g),
                torch.arange(BUCKET_ROWS + 1) % 2 == 0)

    dynamo.reset()
    with dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        compiled = torch.compile(step, fullgraph=True, backend="eager", dynamic=False)
        b1 = batch(range(len(seqs)), 0)
        eager_cache = clone_cache(drv.cache)
        got = compiled(drv.cache, *b1)
        with force_capturable():
            want = step(eager_cache, *b1)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
        assert caches_equal(eager_cache, drv.cache)
        with dynamo.config.patch(error_on_recompile=True):   # same sizes, other values: no recompile
            compiled(eager_cache, *batch([4, 2, 0, 1, 3], 1))
    dynamo.reset()


def test_pad_decode_contract():
    meta = ForwardMetadata.build([[5, 6], [7]], [3, 9], [[0, 1], [2, 3]], 8, is_prefill=False)
    p = meta.pad_decode(6)
    p.validate()
    assert p.seqlens_q.tolist() == [2, 1, 0, 0, 0, 0, 3] and p.first_token_pos.tolist() == [0, 2, 3, 3, 3, 3, 3]
    assert p.context_lens.tolist() == [5, 10, 0, 0, 0, 0, 3] and p.positions.tolist() == [3, 4, 9, 0, 1, 2]
    assert p.slot_mapping.tolist()[3:] == [-1, -1, -1] and p.input_ids.tolist()[3:] == [0, 0, 0]
    assert bool((p.block_tables[2:] == -1).all()) and p.logit_rows.tolist() == [1, 2, 3, 4, 5]
    assert p.max_context_len == 16 and p.row_to_req.tolist() == [0, 0, 1, 6, 6, 6]
