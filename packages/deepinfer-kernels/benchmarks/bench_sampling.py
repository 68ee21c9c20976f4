"""CPU benchmarks of the sampler path at 64 rows x 32000 vocab (pytest-benchmark).

    pytest packages/deepinfer-kernels/benchmarks/bench_sampling.py --benchmark-only
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.sampling import (
    TOP_K_OFF,
    TOP_P_OFF,
    apply_vocab_mask_inplace,
    compute_logprobs,
    get_sum_smaller_probs,
    probs_from_logits,
    random_sampling,
    top_logprobs,
)
from deepinfer_kernels.ops.verification import (
    compute_seqlens_q_by_confidence_rates,
    verify_and_sample,
)

ROWS, VOCAB, NEXTN = 64, 32000, 5


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    return torch.randn(ROWS * (NEXTN + 1), VOCAB, generator=torch.Generator().manual_seed(0)) * 3


def params(rows: int, active: bool):
    t = torch.full((rows,), 0.8)
    k = torch.full((rows,), 50 if active else TOP_K_OFF, dtype=torch.int32)
    p = torch.full((rows,), 0.9 if active else TOP_P_OFF)
    return t, k, p


@pytest.mark.parametrize("active", [False, True], ids=["temperature-only", "top-k50-top-p0.9"])
def test_bench_probs_from_logits(benchmark, logits, active):
    x = logits[:ROWS]
    out = benchmark(probs_from_logits, x, *params(ROWS, active))
    assert out.shape == (ROWS, VOCAB)


def test_bench_random_sampling(benchmark, logits):
    probs = torch.softmax(logits[:ROWS], 1)
    seeds, pos = torch.arange(ROWS), torch.arange(ROWS)
    out = benchmark(random_sampling, probs, seeds, pos, False)
    assert out.shape == (ROWS,)


@pytest.mark.parametrize("drafts", [0, NEXTN], ids=["no-drafts", "5-drafts"])
def test_bench_verify_and_sample(benchmark, logits, drafts):
    rows = ROWS * (drafts + 1)
    probs = torch.softmax(logits[:rows], 1)
    q = torch.softmax(logits[:rows].roll(1, 0), 1)
    seqlens = torch.full((ROWS,), drafts + 1, dtype=torch.int32)
    ftp = (torch.arange(ROWS, dtype=torch.int32) * (drafts + 1))
    draft_ids = probs.argmax(1)
    out = benchmark(verify_and_sample, probs, draft_ids, q, torch.arange(ROWS), torch.arange(rows), ftp, seqlens)
    assert out.token_ids.shape == (ROWS,)


def test_bench_full_sampler_step(benchmark, logits):
    """Logits of 64 requests x 6 rows -> params -> verify + sample -> logprobs + top-20."""
    rows = ROWS * (NEXTN + 1)
    x = logits[:rows]
    t, k, p = params(rows, True)
    q = torch.softmax(x.roll(1, 0), 1)
    seqlens = torch.full((ROWS,), NEXTN + 1, dtype=torch.int32)
    ftp = torch.arange(ROWS, dtype=torch.int32) * (NEXTN + 1)

    def step():
        probs = probs_from_logits(x, t, k, p)
        res = verify_and_sample(probs, probs.argmax(1), q, torch.arange(ROWS), torch.arange(rows), ftp, seqlens)
        lp = compute_logprobs(x[res.final_row.long()])
        return res, top_logprobs(lp, 20)

    res, (vals, ids) = benchmark(step)
    assert ids.shape == (ROWS, 20)


def test_bench_logprobs_top20(benchmark, logits):
    x = logits[:ROWS]
    vals, ids = benchmark(lambda: top_logprobs(compute_logprobs(x), 20))
    assert vals.shape == (ROWS, 20)


def test_bench_get_sum_smaller_probs(benchmark, logits):
    probs = torch.softmax(logits[:ROWS], 1)
    out = benchmark(get_sum_smaller_probs, probs, probs.argmax(1))
    assert out.shape == (ROWS,)


def test_bench_vocab_mask(benchmark, logits):
    mask = torch.randint(-(1 << 31), 1 << 31, (ROWS, VOCAB // 32), dtype=torch.int64).to(torch.int32)
    ids = torch.arange(ROWS, dtype=torch.int32)
    x = logits[:ROWS].clone()
    benchmark(apply_vocab_mask_inplace, x, mask, ids)
    assert torch.isinf(x).any()


def test_bench_confidence_budget(benchmark):
    prev = torch.rand(256, NEXTN)
    remap = torch.randperm(256).to(torch.int32)
    out = torch.empty(256, dtype=torch.int32)
    benchmark(compute_seqlens_q_by_confidence_rates, 256 * 4, remap, prev, out)
    assert int(out.sum()) == 256 * 4
