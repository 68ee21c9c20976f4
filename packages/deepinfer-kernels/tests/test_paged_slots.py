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


def _loop(tables, req, vpos, bs):
    out = torch.full(vpos.shape, -1, dtype=torch.int64)
    for i in range(vpos.shape[0]):
        for j in range(vpos.shape[1]):
            v = int(vpos[i, j])
            if v < 0 or v // bs >= tables.shape[1]:
                continue
            b = int(tables[int(req[i]), v // bs])
            if b >= 0:
                out[i, j] = b * bs + v % bs
    return out


@pytest.mark.parametrize("r,mb,n,k,bs", [(3, 5, 7, 9, 4), (1, 1, 4, 3, 16), (4, 8, 0, 5, 2), (2, 6, 5, 0, 8)])
def test_reference_matches_the_definition(r, mb, n, k, bs):
    tables, req, vpos = _case(r, mb, n, k, bs, seed=r + n + k)
    got = paged_slots(tables, req, vpos, bs)
    assert got.dtype == torch.int64 and torch.equal(got, _loop(tables, req, vpos, bs))


def test_bad_inputs_name_the_field():
    tables, req, vpos = _case(3, 5, 7, 9, 4, seed=1)
    with pytest.raises(ValueError, match="req"):
        paged_slots(tables, req[:3], vpos, 4)
    with pytest.raises(ValueError, match="block_size"):
        paged_slots(tables, req, vpos, 0)
    with pytest.raises(ValueError, match="vpos"):
        paged_slots(tables, req, vpos.float(), 4)


@pytest.mark.gpu
@pytest.mark.parametrize("r,mb,n,k,bs", [(3, 5, 7, 9, 4), (64, 40, 384, 128, 128), (1, 1, 4, 3, 16), (8, 16, 0, 4, 2)])
def test_tilelang_kernel_equals_reference(r, mb, n, k, bs):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("tilelang")
    from deepinfer_kernels.tilelang.paged_slots import paged_slots_tilelang

    tables, req, vpos = _case(r, mb, n, k, bs, seed=n + k, device="cuda")
    want = paged_slots_ref(tables, req, vpos, bs)
    assert torch.equal(paged_slots_tilelang(tables, req, vpos, bs), want)
    assert torch.equal(paged_slots_tilelang(tables.long(), req.int(), vpos.int(), bs), want)
