"""CUDA runs of the sampling/verification ops agree with the CPU (skipped without a GPU).

No TileLang kernel exists for these ops yet, so on CUDA they run the torch references; these
tests pin the cross-device contract any kernel must keep: uniforms bit-identical, samples and
verification results identical (up to float64 prefix-sum rounding exactly at a CDF boundary,
which these fixed inputs do not hit).
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.sampling import (
    RngStream,
    apply_vocab_mask_by_step_inplace,
    counter_uniform,
    get_sum_smaller_probs,
    probs_from_logits,
    random_sampling,
)
from deepinfer_kernels.ops.verification import (
    FRESH_SEQUENCE,
    compute_seqlens_q_by_confidence_rates,
    confidence_head_fused,
    verify_and_sample,
)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_counter_uniform_bit_identical():
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(1 << 62), 1 << 62, (4096,), generator=g)
    pos = torch.randint(0, 1 << 40, (4096,), generator=g)
    for s in RngStream:
        assert torch.equal(counter_uniform(seeds.to(CUDA), pos.to(CUDA), s).cpu(), counter_uniform(seeds, pos, s))


def test_random_sampling_identical():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(64, 32000, generator=g) * 2, 1)
    seeds, pos = torch.arange(64), torch.arange(64) * 7
    nextn = torch.arange(64) % 2 == 0
    cpu = random_sampling(probs, seeds, pos, nextn)
    gpu = random_sampling(probs.to(CUDA), seeds.to(CUDA), pos.to(CUDA), nextn.to(CUDA)).cpu()
    assert torch.equal(cpu, gpu)


def test_verify_and_sample_identical():
    g = torch.Generator().manual_seed(2)
    seqlens = torch.randint(1, 7, (64,), generator=g).to(torch.int32)
    ftp = (torch.cumsum(seqlens, 0) - seqlens).to(torch.int32)
    total_q, vocab = int(seqlens.sum()), 1000
    target = torch.softmax(torch.randn(total_q, vocab, generator=g), 1)
    q = torch.softmax(torch.randn(total_q, vocab, generator=g), 1)
    drafts = torch.randint(0, vocab, (total_q,), generator=g)
    seeds, pos = torch.arange(64), torch.randint(0, 100, (total_q,), generator=g)
    greedy = torch.arange(64) % 3 == 0
    args = (target, drafts, q, seeds, pos, ftp, seqlens, greedy)
    cpu = verify_and_sample(*args)
    gpu = verify_and_sample(*(a.to(CUDA) for a in args))
    for name in ("token_ids", "verified_token_ids", "num_accepted", "last_valid_offset", "final_row"):
        assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), name
    torch.testing.assert_close(cpu.token_logprobs, gpu.token_logprobs.cpu())


def test_other_ops_match():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 500, generator=g)
    t = torch.rand(16, generator=g)
    k = torch.randint(1, 600, (16,), generator=g).to(torch.int32)
    p = torch.rand(16, generator=g) * 0.9 + 0.1
    torch.testing.assert_close(probs_from_logits(logits, t, k, p),
                               probs_from_logits(logits.to(CUDA), t.to(CUDA), k.to(CUDA), p.to(CUDA)).cpu())
    probs = torch.softmax(logits, 1)
    tok = torch.randint(0, 500, (16,), generator=g)
    torch.testing.assert_close(get_sum_smaller_probs(probs, tok), get_sum_smaller_probs(probs.to(CUDA), tok.to(CUDA)).cpu())
    mask = torch.randint(-(1 << 31), 1 << 31, (3, 16), generator=g, dtype=torch.int64).to(torch.int32)
    idx = torch.tensor([0, -1, 2, 1], dtype=torch.int32)
    ftp = torch.tensor([0, 4, 8, 12], dtype=torch.int32)
    a, b = logits.clone(), logits.to(CUDA)
    apply_vocab_mask_by_step_inplace(a, mask, idx, ftp, 2)
    apply_vocab_mask_by_step_inplace(b, mask.to(CUDA), idx.to(CUDA), ftp.to(CUDA), 2)
    assert torch.equal(a, b.cpu())
    prev = torch.rand(40, 5, generator=g)
    remap = torch.randperm(40, generator=g)[:32].to(torch.int32)
    remap[::4] = FRESH_SEQUENCE
    out_c, out_g = torch.empty(32, dtype=torch.int32), torch.empty(32, dtype=torch.int32, device=CUDA)
    compute_seqlens_q_by_confidence_rates(100, remap, prev, out_c)
    compute_seqlens_q_by_confidence_rates(100, remap.to(CUDA), prev.to(CUDA), out_g)
    assert torch.equal(out_c, out_g.cpu())
    hidden, w = torch.randn(10, 64, generator=g), torch.randn(64, generator=g)
    torch.testing.assert_close(confidence_head_fused(hidden, w, torch.tensor([1.0, 2.0])),
                               confidence_head_fused(hidden.to(CUDA), w.to(CUDA), torch.tensor([1.0, 2.0], device=CUDA)).cpu())
