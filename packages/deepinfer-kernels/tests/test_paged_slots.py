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
