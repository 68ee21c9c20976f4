"""attention_indices: the reference against a per-element loop (CPU), the TileLang kernel against
the reference bit for bit (GPU)."""

import pytest
import torch

from deepinfer_kernels.ops.attention_indices import attention_indices, attention_indices_ref


def _case(n, w, k, f, bsz, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    window = torch.randint(-1, 5000, (n, w), generator=g)
    n_far = torch.randint(0, f + 1, (n,), generator=g)
    blocks = torch.randint(-1, max(1, (f + bsz - 1) // bsz) + 1, (n, k), generator=g).int()
    entry = torch.randint(-1, 5000, (n, f), generator=g)
    return [t.to(device) for t in (window, blocks, n_far, entry)]


def _loop(window, wbase, blocks, n_far, entry, ebase, bsz):
    n, w = window.shape
    k, f = blocks.shape[1], entry.shape[1]
    out = torch.full((n, w + k * bsz), -1, dtype=torch.int32)
    for r in range(n):
        for c in range(w):
            if window[r, c] >= 0:
                out[r, c] = int(window[r, c]) + wbase
        for t in range(k):
            for i in range(bsz):
                e = int(blocks[r, t]) * bsz + i
                if blocks[r, t] >= 0 and e < int(n_far[r]) and e < f and entry[r, e] >= 0:
                    out[r, w + t * bsz + i] = int(entry[r, e]) + ebase
    return out


@pytest.mark.parametrize("n,w,k,f,bsz", [(5, 16, 3, 20, 4), (3, 0, 2, 9, 4), (4, 8, 2, 0, 2), (0, 8, 2, 4, 2),
                                         (6, 12, 4, 17, 1)])
def test_reference_matches_the_definition(n, w, k, f, bsz):
    window, blocks, n_far, entry = _case(n, w, k, f, bsz, seed=n + w + k + f)
    got = attention_indices(window, 7000, blocks, n_far, entry, 21000, bsz)
    assert got.dtype == torch.int32 and got.shape == (n, w + k * bsz)
    assert torch.equal(got, _loop(window, 7000, blocks, n_far, entry, 21000, bsz))


def test_bad_inputs_name_the_field():
    window, blocks, n_far, entry = _case(4, 8, 2, 6, 2, seed=1)
    with pytest.raises(ValueError, match="blocks"):
        attention_indices(window, 0, blocks[:3], n_far, entry, 0, 2)
    with pytest.raises(ValueError, match="block_size"):
        attention_indices(window, 0, blocks, n_far, entry, 0, 0)
    with pytest.raises(ValueError, match="entry_base"):
        attention_indices(window, 0, blocks, n_far, entry, -5, 2)
    with pytest.raises(ValueError, match="window_slots"):
        attention_indices(window.float(), 0, blocks, n_far, entry, 0, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,w,k,f,bsz", [(5, 128, 16, 300, 16), (1, 128, 16, 0, 16), (64, 128, 8, 40, 4),
                                         (3, 0, 2, 9, 4), (200, 130, 3, 77, 32), (0, 128, 4, 8, 2)])
def test_tilelang_kernel_equals_reference(n, w, k, f, bsz):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("tilelang")
    from deepinfer_kernels.tilelang.attention_indices import attention_indices_tilelang

    window, blocks, n_far, entry = _case(n, w, k, f, bsz, seed=n * 3 + k, device="cuda")
    want = attention_indices_ref(window, 1 << 20, blocks, n_far, entry, 3 << 20, bsz)
    got = attention_indices_tilelang(window, 1 << 20, blocks, n_far, entry, 3 << 20, bsz)
    assert torch.equal(got, want)
    got32 = attention_indices_tilelang(window.int(), 1 << 20, blocks.long(), n_far.int(), entry.int(), 3 << 20, bsz)
    assert torch.equal(got32, want)
