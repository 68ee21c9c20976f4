"""Engram n-gram buckets: the hash against its definition, the paged reference against a per-row
loop (CPU), the TileLang kernel against the reference bit for bit (GPU)."""

import pytest
import torch

from deepinfer_kernels.ops.engram import HASH_MOD, HASH_MULT, ngram_buckets, paged_ngram_buckets


def _fold(ids):
    h = 0
    for c in ids:
        h = (h * HASH_MULT + c + 1) % HASH_MOD
    return h


def test_hash_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(-1, 1 << 20, (50, 4), generator=g)
    got = ngram_buckets(windows, 65536)
    for i, w in enumerate(windows.tolist()):
        assert got[i].tolist() == [_fold(w[4 - n:]) % 65536 for n in range(2, 5)]


def _case(r, mb, n, bs, slots, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    tables = torch.randint(-1, slots // bs, (r, mb), generator=g).int()
    req = torch.randint(0, r, (n,), generator=g)
    positions = torch.randint(0, mb * bs + bs, (n,), generator=g)
    positions[: min(n, 3)] = torch.tensor([0, 1, 2])[: min(n, 3)]      # windows reaching before 0
    ids = torch.randint(0, 1 << 16, (slots,), generator=g).int()
    return tables.to(device), req.to(device), positions.to(device), ids.to(device)


def _by_rows(tables, req, positions, ids, n_max, size, bs, pad):
    out = []
    for r, p in zip(req.tolist(), positions.tolist(), strict=True):
        window = []
        for v in range(p - n_max + 1, p + 1):
            b = int(tables[r, v // bs]) if 0 <= v and v // bs < tables.shape[1] else -1
            window.append(int(ids[b * bs + v % bs]) if b >= 0 else pad)
        out.append([_fold(window[n_max - n:]) % size for n in range(2, n_max + 1)])
    return torch.tensor(out, dtype=torch.int64).reshape(len(out), n_max - 1)


@pytest.mark.parametrize("r,mb,n,bs,n_max,size", [(3, 5, 11, 4, 3, 1000), (2, 8, 7, 16, 4, 65536), (1, 1, 3, 8, 2, 7),
                                                  (2, 3, 0, 4, 3, 100)])
def test_paged_reference_matches_per_row_loop(r, mb, n, bs, n_max, size):
    tables, req, positions, ids = _case(r, mb, n, bs, 256, seed=r + n)
    got = paged_ngram_buckets(tables, req, positions, ids, n_max, size, bs, -1)
    assert got.dtype == torch.int64 and torch.equal(got, _by_rows(tables, req, positions, ids, n_max, size, bs, -1))


def test_bad_inputs_name_the_field():
    tables, req, positions, ids = _case(3, 5, 7, 4, 64, seed=1)
    with pytest.raises(ValueError, match="req"):
        paged_ngram_buckets(tables, req[:2], positions, ids, 3, 100, 4, -1)
    with pytest.raises(ValueError, match="n_max=1"):
        paged_ngram_buckets(tables, req, positions, ids, 1, 100, 4, -1)
    with pytest.raises(ValueError, match="ids_pool"):
        paged_ngram_buckets(tables, req, positions, ids.float(), 3, 100, 4, -1)


@pytest.mark.gpu
@pytest.mark.parametrize("r,mb,n,bs,n_max,size,ids_dtype", [(3, 5, 11, 4, 3, 1000, torch.int32),
                                                            (64, 40, 300, 128, 3, 65536, torch.int32),
                                                            (8, 16, 130, 16, 4, 1_000_000, torch.int64),
                                                            (2, 3, 0, 4, 3, 100, torch.int32)])
def test_tilelang_kernel_equals_reference(r, mb, n, bs, n_max, size, ids_dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("tilelang")
    from deepinfer_kernels.ops.engram import paged_ngram_buckets_ref
    from deepinfer_kernels.tilelang.engram import paged_ngram_buckets_tilelang

    tables, req, positions, ids = _case(r, mb, n, bs, mb * bs * 2, seed=n + bs, device="cuda")
    ids = ids.to(ids_dtype)
    want = paged_ngram_buckets_ref(tables, req, positions, ids, n_max, size, bs, -1)
    assert torch.equal(paged_ngram_buckets_tilelang(tables, req, positions, ids, n_max, size, bs, -1), want)
    assert torch.equal(paged_ngram_buckets_tilelang(tables.long(), req.int(), positions.int(), ids, n_max, size, bs, -1),
                       want)
