"""CPU tests of the row pairs' shared key lists (``ops.shared_keys``)."""


import pytest
import torch

from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8_ref
from deepinfer_kernels.ops.shared_keys import (
    MAX_SHARED_KEY_SLOT,
    ROW_BITS_SHIFT,
    shared_key_lists,
    shared_key_lists_ref,
    split_shared_keys,
)
from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref
from deepinfer_kernels.tilelang.testing import make_prefill_case, make_sparse_mla_case


def _expected(indices: torch.Tensor) -> list[list[int]]:
    """Brute force of the module docstring's lists."""
    rows, width = indices.shape
    lists = []
    for g in range((rows + 1) // 2):
        a = [s for s in indices[2 * g].tolist() if s >= 0]
        b = [s for s in indices[2 * g + 1].tolist() if s >= 0] if 2 * g + 1 < rows else []
        one, two, both = 1 << ROW_BITS_SHIFT, 2 << ROW_BITS_SHIFT, 3 << ROW_BITS_SHIFT
        if len(set(a)) < len(a) or len(set(b)) < len(b):     # a row repeats a slot: both lists whole
            lists.append([s | one for s in a] + [s | two for s in b])
        else:
            lists.append([s | (both if s in a else two) for s in b] + [s | one for s in a if s not in b])
    return lists


@pytest.mark.parametrize("rows,width,kw", [
    (6, 40, dict(empty_frac=0.2)),
    (7, 33, dict(ragged=True, empty_rows=(2, 6))),      # odd row count: the last pair has one row
    (4, 24, dict(duplicates=True)),                      # a slot twice in one row
    (3, 1, dict()),
    (2, 16, dict(empty_rows=(0, 1))),                    # a pair with no key
    (8, 20, dict(distinct=True)),                        # rows that share nothing
])
def test_shared_key_lists_ref_is_the_union_with_row_bits(rows, width, kw):
    case = make_sparse_mla_case(rows, 4, 64, width, 50, "cpu", seed=rows * 11 + width, **kw)
    keys, counts = shared_key_lists_ref(case.indices)
    assert keys.dtype == torch.int32 and keys.shape == ((rows + 1) // 2, 2 * width)
    assert counts.dtype == torch.int32
    for g, want in enumerate(_expected(case.indices)):
        assert int(counts[g]) == len(want)
        assert keys[g, : len(want)].tolist() == want
        assert bool((keys[g, len(want):] == -1).all())


def test_shared_key_lists_dispatch_and_split():
    idx = torch.tensor([[5, 9, -1], [9, 6, 5], [7, -1, -1]], dtype=torch.int64)
    keys, counts = shared_key_lists(idx)
    assert counts.tolist() == [3, 1]
    slots, bits = split_shared_keys(keys)
    assert slots[0, :3].tolist() == [9, 6, 5] and bits[0, :3].tolist() == [3, 2, 3]
    assert slots[1].tolist() == [7, -1, -1, -1, -1, -1] and bits[1].tolist() == [1, 0, 0, 0, 0, 0]


def test_shared_key_lists_rejects_untaggable_slots():
    with pytest.raises(ValueError, match="2\\^29"):
        shared_key_lists(torch.tensor([[MAX_SHARED_KEY_SLOT]], dtype=torch.int64))
    with pytest.raises(ValueError, match="indices"):
        shared_key_lists(torch.zeros(3, dtype=torch.int64))


def _attention_over_shared_keys(case, keys):
    """The grouped kernel's math in torch: each row attends the pair's entries that carry its bit."""
    slots, bits = split_shared_keys(keys)
    rows, heads, d = case.q.shape
    out = torch.zeros(rows, heads, d)
    lse = torch.full((rows, heads), float("-inf"))
    for r in range(rows):
        g, j = divmod(r, 2)
        mine = (bits[g] >> j) & 1 == 1
        if not bool(mine.any()):
            continue
        kv = dequantize_kv_fp8_ref(case.pool[slots[g][mine]], d)              # [n, D]
        s = case.q[r].float() @ kv.T * case.sm_scale                           # [heads, n]
        lse[r] = torch.logsumexp(s, dim=-1)
        out[r] = torch.softmax(s, dim=-1) @ kv
    return out, lse


@pytest.mark.parametrize("kind", ["prefill", "duplicates"])
def test_attention_over_the_shared_keys_equals_the_per_row_attention(kind):
    if kind == "prefill":   # the engine's prefill layout: windows slide, far entries shared
        case = make_prefill_case(70, 4, 64, 16, 2, 8, 4096, "cpu", seed=3, prompt_len=40, paged=16)
    else:
        case = make_sparse_mla_case(9, 4, 64, 30, 40, "cpu", seed=5, duplicates=True, empty_rows=(3,))
    keys, counts = shared_key_lists_ref(case.indices)
    want_o, want_l = sparse_mla_attention_ref(case.q, case.pool, case.indices, case.sm_scale)
    got_o, got_l = _attention_over_shared_keys(case, keys)
    torch.testing.assert_close(got_o, want_o.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_l, want_l, atol=1e-4, rtol=1e-4)
    if kind == "prefill":   # the point: a pair reads far fewer keys than its two rows
        per_rows = (case.indices >= 0).sum().item()
        assert counts.sum().item() < 0.6 * per_rows


def test_shared_keys_only_where_asked_and_sized():
    from deepinfer_kernels.batch_invariant import batch_invariant_kernels
    from deepinfer_kernels.tilelang.sparse_mla import _uses_groups_kernel

    assert _uses_groups_kernel("bulk", 4096, 16, 384, 1, 1 << 29, True)
    assert not _uses_groups_kernel("bulk", 256, 16, 384, 1, 1000, True)       # decode sizes
    assert not _uses_groups_kernel("bulk", 4096, 16, 384, 1, 1000, False)     # not asked for
    assert not _uses_groups_kernel("ws", 4096, 16, 384, 1, 1000, True)
    assert not _uses_groups_kernel("bulk", 4096, 32, 384, 1, 1000, True)      # 64 columns
    assert not _uses_groups_kernel("bulk", 4096, 16, 1025, 1, 1000, True)     # wider than the kernel's lists
    assert not _uses_groups_kernel("bulk", 4096, 16, 384, 1, (1 << 29) + 1, True)
    with batch_invariant_kernels():   # a row's key blocks would depend on its neighbour
        assert not _uses_groups_kernel("bulk", 4096, 16, 384, 1, 1000, True)
