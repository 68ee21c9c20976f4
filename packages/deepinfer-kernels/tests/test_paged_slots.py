"""paged_slots: the reference against a per-element loop (CPU), the TileLang kernel against the
reference bit for bit (GPU)."""

import pytest
import torch

from deepinfer_kernels.ops.paged_slots import paged_slots, paged_slots_ref


def _case(r, mb, n, k, bs, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    tables = torch.randint(-1, 400, (r, mb), generator=g).int()
    req = torch.randint(0, r, (n,), generator=g)
    vpos = torch.randint(-1, mb * bs + bs + 1, (n, k), generator=g)   # some past the table's width
    return tables.to(device), req.to(device), vpos.to(device)


def _loop(tables, req, vpos, bs, stride=1):
    out = torch.full(vpos.shape, -1, dtype=torch.int64)
    for i in range(vpos.shape[0]):
        for j in range(vpos.shape[1]):
            v = int(vpos[i, j])
            if v < 0 or v // bs >= tables.shape[1]:
                continue
            b = int(tables[int(req[i]), v // bs])
            if b >= 0:
                out[i, j] = b * bs + (v % bs) // stride
    return out


@pytest.mark.parametrize("r,mb,n,k,bs,stride", [(3, 5, 7, 9, 4, 1), (1, 1, 4, 3, 16, 1), (4, 8, 0, 5, 2, 1),
                                                 (2, 6, 5, 0, 8, 1), (3, 5, 7, 9, 4, 4), (2, 6, 9, 40, 8, 2)])
def test_reference_matches_the_definition(r, mb, n, k, bs, stride):
    tables, req, vpos = _case(r, mb, n, k, bs, seed=r + n + k)
    got = paged_slots(tables, req, vpos, bs, stride)
    assert got.dtype == torch.int64 and torch.equal(got, _loop(tables, req, vpos, bs, stride))


def test_stride_packs_a_blocks_entries_into_its_first_slots():
    """Entries of ratio 4 (closing at positions 3, 7, 11, ...) in blocks of 8: two per block, at the
    block's slots 0 and 1, consecutive within a block."""
    tables = torch.tensor([[5, 2, 9]], dtype=torch.int32)
    vpos = (torch.arange(6) * 4 + 3).unsqueeze(0)
    got = paged_slots(tables, torch.zeros(1, dtype=torch.long), vpos, 8, stride=4)
    assert got.tolist() == [[40, 41, 16, 17, 72, 73]]


def test_bad_inputs_name_the_field():
    tables, req, vpos = _case(3, 5, 7, 9, 4, seed=1)
    with pytest.raises(ValueError, match="req"):
        paged_slots(tables, req[:3], vpos, 4)
    with pytest.raises(ValueError, match="block_size"):
        paged_slots(tables, req, vpos, 0)
    with pytest.raises(ValueError, match="vpos"):
        paged_slots(tables, req, vpos.float(), 4)
    with pytest.raises(ValueError, match="stride=3: must be a positive divisor of block_size=4"):
        paged_slots(tables, req, vpos, 4, stride=3)


@pytest.mark.gpu
@pytest.mark.parametrize("r,mb,n,k,bs,stride", [(3, 5, 7, 9, 4, 1), (64, 40, 384, 128, 128, 1), (1, 1, 4, 3, 16, 1),
                                                 (8, 16, 0, 4, 2, 1), (64, 40, 384, 128, 128, 4), (3, 5, 7, 9, 4, 2)])
def test_tilelang_kernel_equals_reference(r, mb, n, k, bs, stride):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("tilelang")
    from deepinfer_kernels.tilelang.paged_slots import paged_slots_tilelang

    tables, req, vpos = _case(r, mb, n, k, bs, seed=n + k, device="cuda")
    want = paged_slots_ref(tables, req, vpos, bs, stride)
    assert torch.equal(paged_slots_tilelang(tables, req, vpos, bs, stride), want)
    assert torch.equal(paged_slots_tilelang(tables.long(), req.int(), vpos.int(), bs, stride), want)


# ---------------------------------------------------------------- the decode rows' slot lists

def _rows_case(r, mb, n, bs, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    tables = torch.randint(-1, 400, (r, mb), generator=g).int()
    req = torch.randint(0, r, (n,), generator=g)
    positions = torch.randint(0, mb * bs + 2 * bs, (n,), generator=g)     # some past the table
    positions[: min(n, 3)] = torch.tensor([0, 1, 5])[: min(n, 3)]          # young rows
    lo = torch.where(torch.rand(n, generator=g) < 0.3, positions - torch.randint(0, 9, (n,), generator=g), 0).clamp(min=0)
    return tables.to(device), req.to(device), positions.to(device), lo.to(device)


def _window_by_definition(tables, req, positions, lo, width, bs):
    vpos = torch.full((positions.shape[0], width), -1, dtype=torch.int64)
    for i, (p, low) in enumerate(zip(positions.tolist(), lo.tolist(), strict=True)):
        run = list(range(max(p - width + 1, low), p + 1))
        vpos[i, : len(run)] = torch.tensor(run, dtype=torch.int64)
    return _loop(tables, req, vpos, bs)


def _far_by_definition(tables, req, positions, width, ratio, max_far, bs):
    vpos = torch.full((positions.shape[0], max_far), -1, dtype=torch.int64)
    counts = []
    for i, p in enumerate(positions.tolist()):
        n = min(max(p - width + 1, 0) // ratio, max_far)
        counts.append(n)
        vpos[i, :n] = torch.arange(n) * ratio + ratio - 1
    return torch.tensor(counts, dtype=torch.int64), _loop(tables, req, vpos, bs, stride=ratio)


@pytest.mark.parametrize("r,mb,n,bs,width", [(3, 5, 9, 4, 6), (2, 40, 17, 8, 128), (1, 1, 3, 16, 1), (4, 8, 0, 2, 5)])
def test_window_slots_reference_matches_the_definition(r, mb, n, bs, width):
    from deepinfer_kernels.ops.paged_slots import window_slots

    tables, req, positions, lo = _rows_case(r, mb, n, bs, seed=r + n)
    slots, slots32 = window_slots(tables, req, positions, lo, width, bs)
    want = _window_by_definition(tables, req, positions, lo, width, bs)
    assert slots.dtype == torch.int64 and slots32.dtype == torch.int32
    assert torch.equal(slots, want) and torch.equal(slots32.long(), want)


@pytest.mark.parametrize("r,mb,n,bs,width,ratio,max_far", [(3, 5, 9, 4, 6, 4, 5), (2, 40, 17, 8, 128, 4, 64),
                                                            (2, 40, 17, 8, 16, 1, 200), (1, 2, 3, 16, 1, 2, 1)])
def test_far_entry_slots_reference_matches_the_definition(r, mb, n, bs, width, ratio, max_far):
    from deepinfer_kernels.ops.paged_slots import far_entry_slots

    tables, req, positions, _ = _rows_case(r, mb, n, bs, seed=r + n + ratio)
    n_far, slots, slots32 = far_entry_slots(tables, req, positions, width, ratio, max_far, bs)
    want_n, want = _far_by_definition(tables, req, positions, width, ratio, max_far, bs)
    assert torch.equal(n_far, want_n) and torch.equal(slots, want) and torch.equal(slots32.long(), want)


def test_slot_lists_bad_inputs_name_the_field():
    from deepinfer_kernels.ops.paged_slots import far_entry_slots, window_slots

    tables, req, positions, lo = _rows_case(3, 5, 7, 4, seed=2)
    with pytest.raises(ValueError, match="lo"):
        window_slots(tables, req, positions, lo[:2], 8, 4)
    with pytest.raises(ValueError, match="width=0"):
        window_slots(tables, req, positions, lo, 0, 4)
    with pytest.raises(ValueError, match="ratio=3: must be a positive divisor of block_size=4"):
        far_entry_slots(tables, req, positions, 8, 3, 4, 4)
    with pytest.raises(ValueError, match="max_far=0"):
        far_entry_slots(tables, req, positions, 8, 4, 0, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("r,mb,n,bs,width,ratio,max_far", [(3, 5, 9, 4, 6, 0, 0), (64, 40, 384, 128, 128, 0, 0),
                                                            (64, 40, 384, 128, 128, 4, 96), (64, 40, 33, 128, 128, 1, 300),
                                                            (3, 5, 9, 4, 6, 2, 3), (8, 16, 0, 2, 4, 0, 0)])
def test_slot_list_kernels_equal_reference(r, mb, n, bs, width, ratio, max_far):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("tilelang")
    from deepinfer_kernels.ops.paged_slots import far_entry_slots_ref, window_slots_ref
    from deepinfer_kernels.tilelang.paged_slots import far_entry_slots_tilelang, window_slots_tilelang

    tables, req, positions, lo = _rows_case(r, mb, n, bs, seed=n + width + ratio, device="cuda")
    if ratio == 0:
        want, got = window_slots_ref(tables, req, positions, lo, width, bs), window_slots_tilelang(
            tables, req, positions, lo, width, bs)
        got_i = window_slots_tilelang(tables.long(), req.int(), positions.int(), lo.int(), width, bs)
    else:
        want, got = far_entry_slots_ref(tables, req, positions, width, ratio, max_far, bs), far_entry_slots_tilelang(
            tables, req, positions, width, ratio, max_far, bs)
        got_i = far_entry_slots_tilelang(tables.long(), req.int(), positions.int(), width, ratio, max_far, bs)
    for w, a, b in zip(want, got, got_i, strict=True):
        assert a.dtype == w.dtype and torch.equal(a, w) and torch.equal(b, w)


def test_more_rows_than_a_grid_holds_take_the_torch_path(monkeypatch):
    """The slot kernels put one row per grid row on y (at most 65,535 on CUDA): beyond it the ops ask
    for the torch path (here: record what they ask the launcher for; on the CPU it is torch anyway)."""
    import deepinfer_kernels.ops.attention_indices as ai
    import deepinfer_kernels.ops.paged_slots as ps
    from deepinfer_kernels.platform import MAX_GRID_Y

    asked = []

    def recorder(op, device, supported=True):
        asked.append((op, supported))
        return None
    monkeypatch.setattr(ps, "tilelang_launcher", recorder)
    monkeypatch.setattr(ai, "tilelang_launcher", recorder)
    tables = torch.zeros(1, 1, dtype=torch.int32)
    for n in (MAX_GRID_Y, MAX_GRID_Y + 1):
        req, pos = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
        ps.paged_slots(tables, req, pos.unsqueeze(1), 4)
        ps.window_slots(tables, req, pos, pos, 1, 4)
        ps.far_entry_slots(tables, req, pos, 1, 4, 1, 4)
        ai.attention_indices(torch.full((n, 1), -1), 0, torch.full((n, 1), -1), pos, torch.full((n, 1), -1), 0, 4)
    assert asked == [(op, True) for op in ("paged_slots", "window_slots", "far_entry_slots", "attention_indices")] + \
        [(op, False) for op in ("paged_slots", "window_slots", "far_entry_slots", "attention_indices")]
