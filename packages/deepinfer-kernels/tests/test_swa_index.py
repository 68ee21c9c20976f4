import pytest
import torch

from deepinfer_kernels.ops.swa_index import expand_swa_index


def test_expand_two_segments():
    pivots = torch.tensor([[5, 3, 20, 2], [0, 0, 0, 0], [7, 4, 0, 0], [1, 0, 9, 4]], dtype=torch.int32)
    out = expand_swa_index(pivots, 6)
    assert out.dtype == torch.int32
    assert out.tolist() == [
        [5, 6, 7, 20, 21, -1],
        [-1] * 6,
        [7, 8, 9, 10, -1, -1],
        [9, 10, 11, 12, -1, -1],
    ]


def test_expand_matches_python_loop_on_random_pivots():
    g = torch.Generator().manual_seed(0)
    n, width = 50, 12
    l1 = torch.randint(0, width + 1, (n,), generator=g)
    l2 = (torch.rand(n, generator=g) * (width - l1 + 1)).long()
    pivots = torch.stack([torch.randint(0, 100, (n,), generator=g), l1,
                          torch.randint(0, 100, (n,), generator=g), l2], 1).int()
    out = expand_swa_index(pivots, width)
    for r, (o1, a, o2, b) in enumerate(pivots.tolist()):
        want = list(range(o1, o1 + a)) + list(range(o2, o2 + b))
        assert out[r].tolist() == want + [-1] * (width - len(want))


def test_expand_rejects_too_long_rows():
    with pytest.raises(ValueError, match="width"):
        expand_swa_index(torch.tensor([[0, 4, 0, 3]], dtype=torch.int32), 6)
