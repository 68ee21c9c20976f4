"""verify_and_sample: greedy verification and exact speculative sampling."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

from deepinfer_kernels.ops.sampling import RngStream, counter_uniform, random_sampling
from deepinfer_kernels.ops.verification import VERIFIED_END, verify_and_sample

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make the sibling data module importable
from speculative_cases import P, Q  # noqa: E402

# ---------------------------------------------------------------- helpers


def layout(seqlens: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    s = torch.tensor(seqlens, dtype=torch.int32)
    return (torch.cumsum(s, 0) - s).to(torch.int32), s, int(s.sum())


def random_probs(rows: int, vocab: int, g: torch.Generator, zero_frac: float = 0.3) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=g) * 2
    logits[torch.rand(rows, vocab, generator=g) < zero_frac] = float("-inf")
    logits[torch.arange(rows), torch.randint(0, vocab, (rows,), generator=g)] = 0.0  # >= 1 finite column
    return torch.softmax(logits, dim=1)


def uniform(seed: int, position: int, stream: RngStream) -> float:
    return float(counter_uniform(torch.tensor([seed]), torch.tensor([position]), stream)[0])


def inverse_cdf(weights: list[float], u: float) -> int:
    total = math.fsum(weights)
    acc = 0.0
    for c, w in enumerate(weights):
        acc += w
        if acc > u * total and w > 0:
            return c
    return max(c for c, w in enumerate(weights) if w > 0)


def oracle(target, drafts, draft_probs, seeds, positions, seqlens, greedy):
    """Request-by-request, row-by-row speculative decoding (Leviathan et al., Algorithm 1)."""
    vocab = target.shape[1]
    tokens, verified, accepted = [], [VERIFIED_END] * target.shape[0], []
    first = 0
    for i, s in enumerate(seqlens):
        seed = int(seeds[i])
        a = 0
        while a < s - 1:
            r = first + a
            p, x = target[r].double().tolist(), int(drafts[r])
            q = [float(v) for v in draft_probs[r].double()] if draft_probs is not None else \
                [1.0 if c == x else 0.0 for c in range(vocab)]
            if greedy[i]:
                ok = x == int(target[r].argmax())
            else:
                ok = uniform(seed, int(positions[r]) + 1, RngStream.ACCEPT) * q[x] < p[x]
            if not ok:
                break
            verified[r] = x
            a += 1
        f = first + a
        p = target[f].double().tolist()
        if greedy[i]:
            main = int(target[f].argmax())
        elif a < s - 1:  # rejected at f: residual max(0, p - q)
            x = int(drafts[f])
            q = [float(v) for v in draft_probs[f].double()] if draft_probs is not None else \
                [1.0 if c == x else 0.0 for c in range(vocab)]
            res = [max(0.0, pc - qc) for pc, qc in zip(p, q, strict=True)]
            if sum(res) <= 0:
                res = p
            main = inverse_cdf(res, uniform(seed, int(positions[f]) + 1, RngStream.RESIDUAL))
        else:
            main = inverse_cdf(p, uniform(seed, int(positions[f]) + 1, RngStream.SAMPLE))
        tokens.append(main)
        accepted.append(a)
        first += s
    return tokens, verified, accepted


def run_case(seqlens, vocab, g, *, dense_q=True, greedy_frac=0.3, match_frac=0.5):
    ftp, s, total_q = layout(seqlens)
    req_cnt = len(seqlens)
    target = random_probs(total_q, vocab, g)
    draft_probs = random_probs(total_q, vocab, g, zero_frac=0.2) if dense_q else None
    # Drafts: half the time the target argmax (so greedy accepts happen), else a random column.
    drafts = torch.where(torch.rand(total_q, generator=g) < match_frac, target.argmax(1),
                         torch.randint(0, vocab, (total_q,), generator=g))
    seeds = torch.randint(-(1 << 62), 1 << 62, (req_cnt,), generator=g, dtype=torch.int64)
    positions = torch.randint(0, 1000, (total_q,), generator=g)
    greedy = torch.rand(req_cnt, generator=g) < greedy_frac
    out = verify_and_sample(target, drafts, draft_probs, seeds, positions, ftp, s, greedy)
    exp = oracle(target, drafts, draft_probs, seeds, positions, seqlens, greedy.tolist())
    return out, exp, (target, drafts, ftp)


# ---------------------------------------------------------------- against the loop oracle


@pytest.mark.parametrize("dense_q", [True, False])
@pytest.mark.parametrize("case", range(12))
def test_matches_loop_oracle_on_ragged_batches(case, dense_q):
    g = torch.Generator().manual_seed(100 + case)
    seqlens = torch.randint(1, 7, (int(torch.randint(0, 20, (1,), generator=g)),), generator=g).tolist()
    out, (tokens, verified, accepted), (target, drafts, ftp) = run_case(seqlens, 13, g, dense_q=dense_q)
    assert out.token_ids.dtype == torch.int32 and out.token_ids.tolist() == tokens
    assert out.verified_token_ids.tolist() == verified
    assert out.num_accepted.tolist() == accepted
    assert out.last_valid_offset.tolist() == accepted
    assert out.final_row.tolist() == (ftp + out.num_accepted).tolist()
    # Logprobs: main token under the final row's target distribution; accepted drafts under their row.
    f = out.final_row.long()
    exp_lp = torch.log(target[f, out.token_ids.long()])
    torch.testing.assert_close(out.token_logprobs, exp_lp)
    acc = out.verified_token_ids != VERIFIED_END
    rows = torch.nonzero(acc).squeeze(1)
    torch.testing.assert_close(out.verified_logprobs[rows], torch.log(target[rows, drafts[rows]]))
    assert torch.all(out.verified_logprobs[~acc] == 0)


@pytest.mark.parametrize(
    "seqlens", [[], [1] * 8, [6] * 5, [2, 1, 6, 3, 1]], ids=["empty", "no-drafts", "full", "mixed"]
)
def test_edge_batches_match_oracle(seqlens):
    g = torch.Generator().manual_seed(7)
    out, (tokens, verified, accepted), _ = run_case(seqlens, 9, g)
    assert out.token_ids.tolist() == tokens and out.verified_token_ids.tolist() == verified
    assert out.num_accepted.tolist() == accepted


def test_greedy_all_accepted_and_all_rejected():
    g = torch.Generator().manual_seed(3)
    ftp, s, total_q = layout([4, 3])
    target = random_probs(total_q, 11, g)
    argmax = target.argmax(1)
    seeds = torch.zeros(2, dtype=torch.int64)
    pos = torch.arange(total_q)
    greedy = torch.ones(2, dtype=torch.bool)
    out = verify_and_sample(target, argmax, None, seeds, pos, ftp, s, greedy)
    assert out.num_accepted.tolist() == [3, 2]
    assert out.verified_token_ids.tolist() == argmax[[0, 1, 2]].tolist() + [-1] + argmax[[4, 5]].tolist() + [-1]
    assert out.token_ids.tolist() == [int(argmax[3]), int(argmax[6])]
    wrong = (argmax + 1) % 11
    out = verify_and_sample(target, wrong, None, seeds, pos, ftp, s, greedy)
    assert out.num_accepted.tolist() == [0, 0]
    assert out.verified_token_ids.tolist() == [VERIFIED_END] * total_q
    assert out.token_ids.tolist() == [int(argmax[0]), int(argmax[4])]  # the target's argmax at the first row


def test_sampling_rejects_impossible_drafts_and_resamples_elsewhere():
    """p(x) = 0 is never accepted; the residual then never returns x."""
    vocab, n = 5, 2000
    target = torch.tensor([[0.0, 0.5, 0.3, 0.2, 0.0]]).repeat(2 * n, 1)
    draft_q = torch.tensor([[0.6, 0.1, 0.1, 0.1, 0.1]]).repeat(2 * n, 1)
    ftp, s, total_q = layout([2] * n)
    drafts = torch.zeros(total_q, dtype=torch.int64)  # draft token 0, p(0) = 0
    out = verify_and_sample(target, drafts, draft_q, torch.arange(n), torch.zeros(total_q, dtype=torch.int64),
                            ftp, s)
    assert out.num_accepted.sum() == 0
    assert not bool(((out.token_ids == 0) | (out.token_ids == 4)).any())
    assert (out.verified_token_ids == VERIFIED_END).all() and vocab == 5


def test_no_drafts_is_random_sampling_at_the_next_position():
    """seqlen_q = 1 everywhere: the main token is random_sampling(p, seed, position + 1, target stream)."""
    g = torch.Generator().manual_seed(11)
    n, vocab = 64, 50
    ftp, s, _ = layout([1] * n)
    target = random_probs(n, vocab, g)
    seeds = torch.randint(0, 1 << 40, (n,), generator=g)
    pos = torch.randint(0, 4096, (n,), generator=g)
    out = verify_and_sample(target, torch.zeros(n, dtype=torch.int32), None, seeds, pos, ftp, s)
    assert out.token_ids.long().tolist() == random_sampling(target, seeds, pos + 1, False).tolist()


def test_batch_invariance_under_request_permutation():
    g = torch.Generator().manual_seed(5)
    seqlens = [3, 1, 6, 2, 4, 5, 1]
    ftp, s, total_q = layout(seqlens)
    target = random_probs(total_q, 17, g)
    q = random_probs(total_q, 17, g)
    drafts = torch.randint(0, 17, (total_q,), generator=g)
    seeds = torch.randint(0, 1 << 50, (7,), generator=g)
    pos = torch.randint(0, 500, (total_q,), generator=g)
    base = verify_and_sample(target, drafts, q, seeds, pos, ftp, s)
    perm = [4, 0, 6, 2, 1, 5, 3]
    row_perm = torch.cat([torch.arange(int(ftp[i]), int(ftp[i]) + seqlens[i]) for i in perm])
    ftp2, s2, _ = layout([seqlens[i] for i in perm])
    out = verify_and_sample(target[row_perm], drafts[row_perm], q[row_perm], seeds[perm], pos[row_perm], ftp2, s2)
    assert out.token_ids.tolist() == base.token_ids[perm].tolist()
    assert out.num_accepted.tolist() == base.num_accepted[perm].tolist()
    assert out.verified_token_ids.tolist() == base.verified_token_ids[row_perm].tolist()


# ---------------------------------------------------------------- exactness of speculative sampling

NUM_DRAFTS = 5


def simulate_blocks(num_blocks: int, dense_q: bool, seed_base: int = 0):
    """Draft a 5-token block for every request with the DRAFT stream, then verify all blocks at once."""
    rows = NUM_DRAFTS + 1
    start = 1000
    seeds = torch.arange(seed_base, seed_base + num_blocks, dtype=torch.int64)
    drafts = torch.zeros(num_blocks, rows, dtype=torch.int64)
    for m in range(1, rows):  # draft for position start + m, checked by row m - 1
        if dense_q:
            drafts[:, m - 1] = random_sampling(Q[m - 1].expand(num_blocks, -1), seeds,
                                               torch.full((num_blocks,), start + m), True)
        else:
            drafts[:, m - 1] = m - 1  # deterministic drafts (one-hot q)
    target = P.repeat(num_blocks, 1)
    draft_probs = torch.cat([Q, torch.zeros(1, 6)]).repeat(num_blocks, 1) if dense_q else None
    positions = (start + torch.arange(rows)).repeat(num_blocks)
    seqlens = torch.full((num_blocks,), rows, dtype=torch.int32)
    ftp = (torch.arange(num_blocks, dtype=torch.int32) * rows)
    out = verify_and_sample(target, drafts.reshape(-1), draft_probs, seeds, positions, ftp, seqlens)
    return drafts, out


def emitted_token_distributions(drafts: torch.Tensor, out) -> list[torch.Tensor]:
    """Token emitted at each position m = 1..6 by the blocks that reached it."""
    a = out.num_accepted.long()
    per_position = []
    for m in range(1, NUM_DRAFTS + 2):
        reached = a >= m - 1
        token = drafts[:, m - 1] if m <= NUM_DRAFTS else torch.zeros_like(a)
        token = torch.where(a >= m, token, out.token_ids.long())
        per_position.append(token[reached])
    return per_position


def assert_matches(samples: torch.Tensor, p: torch.Tensor, label: str) -> None:
    counts = torch.bincount(samples, minlength=p.numel()).double()
    support = p > 0
    assert counts[~support].sum() == 0, f"{label}: sampled a zero-probability token"
    p64 = p.double() / p.double().sum()
    expected = p64[support] * counts.sum()
    result = stats.chisquare(counts[support].numpy(), expected.numpy())
    assert result.pvalue > 0.01, f"{label}: chi-square p-value {result.pvalue:.4g}, counts {counts.tolist()}"


def test_speculative_sampling_is_exact_at_every_block_position():
    """10^6 five-draft blocks: the token emitted at each position is distributed as p."""
    drafts, out = simulate_blocks(1_000_000, dense_q=True)
    per_position = emitted_token_distributions(drafts, out)
    for m, tokens in enumerate(per_position, start=1):
        assert tokens.numel() > 100_000, f"position {m}: only {tokens.numel()} samples"
        assert_matches(tokens, P[m - 1], f"position {m}")
    # The draft-stream samples themselves follow q (the premise of the guarantee).
    for m in range(1, NUM_DRAFTS + 1):
        assert_matches(drafts[:200_000, m - 1], Q[m - 1], f"draft {m}")


def test_speculative_sampling_is_exact_with_deterministic_drafts():
    """draft_probs=None (one-hot q): accept with probability p(x), residual = p without x."""
    drafts, out = simulate_blocks(300_000, dense_q=False, seed_base=1 << 40)
    for m, tokens in enumerate(emitted_token_distributions(drafts, out), start=1):
        assert_matches(tokens, P[m - 1], f"position {m}")


def test_acceptance_rate_matches_theory():
    """P(accept at position m) = sum_x min(p_m(x), q_m(x))."""
    drafts, out = simulate_blocks(200_000, dense_q=True, seed_base=77)
    a = out.num_accepted.long()
    for m in range(1, NUM_DRAFTS + 1):
        reached = int((a >= m - 1).sum())
        rate = float((a >= m).sum()) / reached
        theory = float(torch.minimum(P[m - 1], Q[m - 1]).sum())
        assert abs(rate - theory) < 4 * math.sqrt(theory * (1 - theory) / reached) + 1e-3


# ---------------------------------------------------------------- argument checks


def test_argument_errors():
    ftp, s, total_q = layout([2, 1])
    p = torch.full((3, 4), 0.25)
    d = torch.zeros(3, dtype=torch.int32)
    seeds = torch.zeros(2, dtype=torch.int64)
    pos = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[total_q, vocab\]"):
        verify_and_sample(p, d, torch.ones(3, 5), seeds, pos, ftp, s)
    with pytest.raises(TypeError, match="seeds must have dtype int64"):
        verify_and_sample(p, d, None, seeds.int(), pos, ftp, s)
    with pytest.raises(ValueError, match=r"positions must have shape \[total_q\]"):
        verify_and_sample(p, d, None, seeds, pos[:2], ftp, s)
    with pytest.raises(ValueError, match=r"draft_token_ids\[0\] = 4 on a verify row"):
        verify_and_sample(p, torch.tensor([4, 0, 0], dtype=torch.int32), None, seeds, pos, ftp, s)
    with pytest.raises(ValueError, match=r"is_greedy must have shape \[req_cnt\]"):
        verify_and_sample(p, d, None, seeds, pos, ftp, s, torch.zeros(3, dtype=torch.bool))
    # Out-of-range ids on final rows are ignored (they carry no draft).
    verify_and_sample(p, torch.tensor([0, 99, -5], dtype=torch.int32), None, seeds, pos, ftp, s)


def test_exactness_check_has_power(monkeypatch):
    """Negative control: resampling from p instead of norm(max(0, p - q)) after a rejection (a
    classic bug) biases the output, and the same chi-square check catches it."""
    import deepinfer_kernels.ops.verification.speculative as spec

    monkeypatch.setattr(spec, "residual_probs_ref", lambda target, ids, q: target.to(torch.float64))
    drafts, out = simulate_blocks(200_000, dense_q=True, seed_base=5)
    failures = 0
    for m, tokens in enumerate(emitted_token_distributions(drafts, out), start=1):
        try:
            assert_matches(tokens, P[m - 1], f"position {m}")
        except AssertionError:
            failures += 1
    assert failures >= 3
