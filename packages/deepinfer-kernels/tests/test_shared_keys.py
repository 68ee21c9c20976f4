"""CPU tests of the row pairs' shared key lists (``ops.shared_keys``)."""


import pytest
import torch

from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8_ref
from deepinfer_kernels.ops.shared_keys import (
    MAX_SHARED_KEY_SLOT,
    row_bits_shift,
    shared_key_lists,
    shared_key_lists_ref,
    split_shared_keys,
)
from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref
from deepinfer_kernels.testing import make_prefill_case, make_sparse_mla_case


def _expected(indices: torch.Tensor, n: int = 2) -> list[list[int]]:
    """Brute force of the module docstring's lists, groups of ``n`` rows."""
    rows, width = indices.shape
    shift = row_bits_shift(n)
    lists = []
    for g in range((rows + n - 1) // n):
        members = [[s for s in indices[n * g + j].tolist() if s >= 0] if n * g + j < rows else [] for j in range(n)]
        if any(len(set(m)) < len(m) for m in members):     # a row repeats a slot: the lists whole
            lists.append([s | (1 << j) << shift for j, m in enumerate(members) for s in m])
            continue
        out = []
        for j in reversed(range(n)):
            for s in members[j]:
                if any(s in members[k] for k in range(j + 1, n)):
                    continue
                bits = (1 << j) | sum(1 << k for k in range(j) if s in members[k])
                out.append(s | bits << shift)
        lists.append(out)
    return lists


@pytest.mark.parametrize("rows,width,kw", [
    (6, 40, dict(empty_frac=0.2)),
    (7, 33, dict(ragged=True, empty_rows=(2, 6))),      # odd row count: the last pair has one row
    (4, 24, dict(duplicates=True)),                      # a slot twice in one row
    (3, 1, dict()),
    (2, 16, dict(empty_rows=(0, 1))),                    # a pair with no key
    (8, 20, dict(distinct=True)),                        # rows that share nothing
])
@pytest.mark.parametrize("n", [2, 4])
def test_shared_key_lists_ref_is_the_union_with_row_bits(rows, width, kw, n):
    case = make_sparse_mla_case(rows, 4, 64, width, 50, "cpu", seed=rows * 11 + width, **kw)
    keys, counts = shared_key_lists_ref(case.indices, n)
    assert keys.dtype == torch.int32 and keys.shape == ((rows + n - 1) // n, n * width)
    assert counts.dtype == torch.int32
    for g, want in enumerate(_expected(case.indices, n)):
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


def test_shared_key_lists_of_quads():
    idx = torch.tensor([[5, 9, -1], [9, 6, 5], [7, -1, -1], [6, 8, -1], [4, -1, -1]], dtype=torch.int64)
    keys, counts = shared_key_lists(idx, 4)
    assert keys.shape == (2, 12) and counts.tolist() == [5, 1]
    slots, bits = split_shared_keys(keys, 4)
    assert slots[0].tolist() == [6, 8, 7, 9, 5] + [-1] * 7          # row 3's, row 2's, row 1's the later rows lack
    assert bits[0, :5].tolist() == [0b1010, 0b1000, 0b0100, 0b0011, 0b0011]
    assert slots[1, 0].item() == 4 and bits[1, 0].item() == 1


def test_shared_key_lists_rejects_untaggable_slots():
    with pytest.raises(ValueError, match="2\\^29"):
        shared_key_lists(torch.tensor([[MAX_SHARED_KEY_SLOT]], dtype=torch.int64))
    with pytest.raises(ValueError, match="2\\^27"):
        shared_key_lists(torch.tensor([[1 << 27]], dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="group_rows"):
        shared_key_lists(torch.tensor([[1]], dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="indices"):
        shared_key_lists(torch.zeros(3, dtype=torch.int64))


def _attention_over_shared_keys(case, keys, n=2):
    """The grouped kernels' math in torch: each row attends the group's entries that carry its bit."""
    slots, bits = split_shared_keys(keys, n)
    rows, heads, d = case.q.shape
    out = torch.zeros(rows, heads, d)
    lse = torch.full((rows, heads), float("-inf"))
    for r in range(rows):
        g, j = divmod(r, n)
        mine = (bits[g] >> j) & 1 == 1
        if not bool(mine.any()):
            continue
        kv = dequantize_kv_fp8_ref(case.pool[slots[g][mine]], d)              # [n, D]
        s = case.q[r].float() @ kv.T * case.sm_scale                           # [heads, n]
        lse[r] = torch.logsumexp(s, dim=-1)
        out[r] = torch.softmax(s, dim=-1) @ kv
    return out, lse


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["prefill", "duplicates"])
def test_attention_over_the_shared_keys_equals_the_per_row_attention(kind, n):
    if kind == "prefill":   # the engine's prefill layout: windows slide, far entries shared
        case = make_prefill_case(70, 4, 64, 16, 2, 8, 4096, "cpu", seed=3, prompt_len=40, paged=16)
    else:
        case = make_sparse_mla_case(9, 4, 64, 30, 40, "cpu", seed=5, duplicates=True, empty_rows=(3,))
    keys, counts = shared_key_lists_ref(case.indices, n)
    want_o, want_l = sparse_mla_attention_ref(case.q, case.pool, case.indices, case.sm_scale)
    got_o, got_l = _attention_over_shared_keys(case, keys, n)
    torch.testing.assert_close(got_o, want_o.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_l, want_l, atol=1e-4, rtol=1e-4)
    if kind == "prefill":   # the point: a group reads far fewer keys than its rows one by one
        per_rows = (case.indices >= 0).sum().item()
        assert counts.sum().item() < (0.6 if n == 2 else 0.35) * per_rows


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


def test_quads_only_at_16_heads_and_where_the_lists_fit(monkeypatch):
    from deepinfer_kernels.envs import SPARSE_MLA_GROUP_ROWS_ENV as GROUP_ROWS_ENV
    from deepinfer_kernels.ops.sparse_mla import shared_key_group_rows
    from deepinfer_kernels.tilelang.sparse_mla import _uses_quads_kernel

    monkeypatch.delenv(GROUP_ROWS_ENV, raising=False)
    assert shared_key_group_rows() == 4            # quads unless pairs are asked for
    assert _uses_quads_kernel("bulk", 4096, 16, 384, 1, 1000, True)
    monkeypatch.setenv(GROUP_ROWS_ENV, "4")
    assert _uses_quads_kernel("bulk", 4096, 16, 384, 1, 1 << 27, True)
    assert not _uses_quads_kernel("bulk", 4096, 16, 384, 1, 1000, False)      # not asked for
    assert not _uses_quads_kernel("bulk", 4096, 8, 384, 1, 1000, True)        # 8 heads: pairs
    assert _uses_quads_kernel("bulk", 4096, 16, 480, 1, 1000, True)
    assert not _uses_quads_kernel("bulk", 4096, 16, 481, 1, 1000, True)       # a quad list over 30 blocks of 64
    assert not _uses_quads_kernel("bulk", 4096, 16, 384, 1, (1 << 27) + 1, True)   # 27 slot bits
    monkeypatch.setenv(GROUP_ROWS_ENV, "2")
    assert not _uses_quads_kernel("bulk", 4096, 16, 384, 1, 1000, True)
    monkeypatch.setenv(GROUP_ROWS_ENV, "3")
    with pytest.raises(ValueError, match=GROUP_ROWS_ENV):
        shared_key_group_rows()
