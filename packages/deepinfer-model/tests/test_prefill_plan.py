"""The prefill row plan (host-computed row sets, `engine/prefill_plan.py`): the same sets the
forward derives on the device, the same errors, and a forward that gives the same logits and
cache with the plan as without it."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer_kernels.ops.capture import force_capturable
from deepinfer_model.paged.forward import full_row_mask
from deepinfer_model.paged.prefill_plan import plan_prefill_rows, with_row_plan
from deepinfer_model.metadata import MetadataError
from deepinfer_model.testing import Driver, Seq, caches_equal, clone_cache, tiny_model


def _prompts(lengths, seed=0):
    g = np.random.default_rng(seed)
    return [Seq(g.integers(10, 8000, size=n).tolist(), n) for n in lengths]


def test_plan_equals_the_device_row_sets():
    model = tiny_model()
    cfg = model.config
    driver = Driver(model, num_blocks=128)
    seqs = _prompts([40, 7, 33, 21, 50])
    # first chunks (two requests finish), then the rest (every request finishes)
    for chunks in ([24, 7, 16, 21, 30], [16, 0, 17, 0, 20]):
        live = [(s, n) for s, n in zip(seqs, chunks, strict=True) if n]
        meta = driver.prefill_meta([s for s, _ in live], [n for _, n in live])
        plan = with_row_plan(cfg, meta).row_plan
        req, positions = meta.row_to_req, meta.positions.long()
        full, _ = full_row_mask(model, meta, req, positions)
        want_full = full.nonzero().squeeze(1)
        assert torch.equal(plan.full_rows, want_full)
        inv = torch.full((meta.total_q,), -1, dtype=torch.long)
        inv[want_full] = torch.arange(want_full.numel())
        assert torch.equal(plan.logit_rows_in_full, inv[meta.logit_rows])
        ratios = {cfg.compress_ratios[s] for s in cfg.topology.compressed_sources} - {0, 1}
        assert set(plan.closing_rows) == ratios and ratios
        for r, rows in plan.closing_rows.items():
            want = ((meta.slot_mapping >= 0) & (positions % r == r - 1)).nonzero().squeeze(1)
            assert torch.equal(rows, want)
        for s, n in live:
            s.num_computed += n


def test_plan_raises_what_the_forward_raises():
    model = tiny_model()
    cfg = model.config
    w = cfg.sliding_window
    driver = Driver(model, num_blocks=128)
    # a last chunk that starts after the replay segment's first token: the forward's message
    seq = _prompts([w + 10])[0]
    seq.num_computed = 12
    meta = driver.prefill_meta([seq], [w - 2])
    with pytest.raises(MetadataError, match="must hold the last") as host_err:
        with_row_plan(cfg, meta)
    req, positions = meta.row_to_req, meta.positions.long()
    with pytest.raises(MetadataError, match="must hold the last") as device_err:
        full_row_mask(model, meta, req, positions)
    assert str(host_err.value) == str(device_err.value)
    # a compressed entry whose first tokens have no block: the forward's RuntimeError
    p = np.arange(4)   # slots say block 3 while the table has no block 0
    with pytest.raises(RuntimeError, match="no slot in the block table"):
        plan_prefill_rows(cfg, p, np.array([4]), np.array([4]), np.array([False]), p + 12, np.array([[-1, 3]]), 4,
                          np.zeros(0, dtype=np.int64))


def test_forward_with_the_plan_equals_the_forward_without():
    model = tiny_model()
    driver = Driver(model, num_blocks=128)
    seqs = _prompts([40, 9, 35, 26], seed=1)
    for chunks in ([20, 9, 16, 26], [20, 0, 19, 0]):
        live = [(s, n) for s, n in zip(seqs, chunks, strict=True) if n]
        meta = driver.prefill_meta([s for s, _ in live], [n for _, n in live])
        planned = with_row_plan(model.config, meta)
        assert planned.row_plan is not None and meta.row_plan is None
        cache = clone_cache(driver.cache)
        want = model.forward(meta, driver.cache)
        got = model.forward(planned, cache)
        assert torch.equal(got.logits, want.logits) and torch.equal(got.full_rows, want.full_rows)
        assert caches_equal(cache, driver.cache)
        for s, n in live:
            s.num_computed += n


class _SyncOps(TorchDispatchMode):
    """Records the ops that read a device value on the host (a sync on the GPU) or whose output
    shape depends on tensor values."""
    NAMES = ("nonzero", "_local_scalar_dense", "is_nonzero", "item", "masked_select", "unique", "repeat_interleave")

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.NAMES and not (name == "repeat_interleave" and "output_size" in (kwargs or {})):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_prefill_forward_with_the_plan_reads_no_device_value():
    """With the runner's exact context bound and the row plan, a prefill step (chunked, YOCO
    replay, compressed sources of ratios 2 and 4) issues no sync; without the plan it does."""
    model = tiny_model()
    driver = Driver(model, num_blocks=128)
    seqs = _prompts([40, 9, 35], seed=2)
    meta = driver.prefill_meta(seqs, [24, 9, 35])
    meta.max_context_len = int(meta.context_lens.max())
    planned = with_row_plan(model.config, meta)
    with force_capturable(), _SyncOps() as ops:   # the CUDA code path (no CPU-only value checks)
        model.forward(planned, clone_cache(driver.cache))
    assert ops.seen == []
    with force_capturable(), _SyncOps() as ops:
        model.forward(meta, clone_cache(driver.cache))
    assert "nonzero" in ops.seen
