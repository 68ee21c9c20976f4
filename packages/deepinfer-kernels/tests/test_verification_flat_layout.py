"""prepare_verification_metadata / get_accept_result / finalize_verification vs per-request loops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.ops.verification import (
    VERIFIED_END,
    finalize_verification,
    get_accept_result,
    prepare_verification_metadata,
)

# ---------------------------------------------------------------- helpers


def make_layout(seqlens: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    s = torch.tensor(seqlens, dtype=torch.int32)
    ftp = (torch.cumsum(s, 0) - s).to(torch.int32)
    return ftp, s, int(s.sum())


def oracle_metadata(seqlens: list[int]):
    row_to_req, local_step, is_verify = [], [], []
    for i, s in enumerate(seqlens):
        for k in range(s):
            row_to_req.append(i)
            local_step.append(k)
            is_verify.append(k < s - 1)
    return row_to_req, local_step, is_verify


def oracle_verify(seqlens: list[int], raw_accept: list[bool], drafts: list[int]):
    """Per-request walk: accept drafts until the first rejection; the row after the prefix is final."""
    total = sum(seqlens)
    effective, is_final, verified = [False] * total, [False] * total, [VERIFIED_END] * total
    final_row, accepted, verified_count = [], [], []
    first = 0
    for s in seqlens:
        a = 0
        while a < s - 1 and raw_accept[first + a]:
            effective[first + a] = True
            verified[first + a] = drafts[first + a]
            a += 1
        is_final[first + a] = True
        final_row.append(first + a)
        accepted.append(a)
        verified_count.append(s - 1)
        first += s
    return effective, is_final, verified, final_row, accepted, verified_count


def run_pipeline(seqlens: list[int], raw_accept: list[bool], drafts: list[int]):
    ftp, s, total_q = make_layout(seqlens)
    row_to_req, local_step, is_verify = prepare_verification_metadata(ftp, s, total_q)
    raw = torch.tensor(raw_accept, dtype=torch.bool).reshape(total_q)
    effective, is_final = get_accept_result(raw, is_verify, ftp, row_to_req)
    fin = finalize_verification(effective, is_final, is_verify, torch.tensor(drafts, dtype=torch.int32).reshape(total_q),
                                ftp, row_to_req)
    return (row_to_req, local_step, is_verify), (effective, is_final), fin


def check_against_oracle(seqlens: list[int], raw_accept: list[bool], drafts: list[int]) -> None:
    (row_to_req, local_step, is_verify), (effective, is_final), fin = run_pipeline(seqlens, raw_accept, drafts)
    o_req, o_step, o_verify = oracle_metadata(seqlens)
    assert row_to_req.dtype == torch.int32 and local_step.dtype == torch.int32 and is_verify.dtype == torch.bool
    assert row_to_req.tolist() == o_req
    assert local_step.tolist() == o_step
    assert is_verify.tolist() == o_verify
    o_eff, o_final, o_verified, o_final_row, o_acc, o_ver = oracle_verify(seqlens, raw_accept, drafts)
    assert effective.tolist() == o_eff
    assert is_final.tolist() == o_final
    assert fin.verified_token_ids.dtype == torch.int32
    assert fin.verified_token_ids.tolist() == o_verified
    assert fin.final_row.tolist() == o_final_row
    assert fin.num_accepted.tolist() == o_acc
    assert fin.last_valid_offset.tolist() == o_acc  # the final row sits right after the accepted prefix
    assert fin.num_verified.tolist() == o_ver
    # Ledger checkpoint 2 (seed 000): within a request, no real token after the first VERIFIED_END.
    first = 0
    for s in seqlens:
        ids = fin.verified_token_ids[first:first + s].tolist()
        if VERIFIED_END in ids:
            assert all(t == VERIFIED_END for t in ids[ids.index(VERIFIED_END):])
        assert ids[-1] == VERIFIED_END  # the final row is never a verified token
        first += s


# ---------------------------------------------------------------- the seed-000 worked example


def test_worked_example_seed_000():
    """A/B/C with seqlen_q 4, 2, 1: A accepts 2 of 3 drafts, B rejects its draft, C has none."""
    t1, t2, t3, b1 = 101, 102, 103, 201
    seqlens = [4, 2, 1]
    drafts = [t1, t2, t3, 0, b1, 0, 0]  # draft checked at each row = token of the next row
    raw = [True, True, False, True, False, True, True]  # values on final rows must be ignored
    (row_to_req, local_step, is_verify), (effective, is_final), fin = run_pipeline(seqlens, raw, drafts)
    assert row_to_req.tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert local_step.tolist() == [0, 1, 2, 3, 0, 1, 0]
    assert is_verify.tolist() == [True, True, True, False, True, False, False]
    assert effective.tolist() == [True, True, False, False, False, False, False]
    assert is_final.tolist() == [False, False, True, False, True, False, True]
    assert fin.verified_token_ids.tolist() == [t1, t2, -1, -1, -1, -1, -1]
    assert fin.final_row.tolist() == [2, 4, 6]
    assert fin.last_valid_offset.tolist() == [2, 0, 0]
    assert fin.num_accepted.tolist() == [2, 0, 0]
    assert fin.num_verified.tolist() == [3, 1, 0]
    assert VERIFIED_END == -1


# ---------------------------------------------------------------- edge batches


@pytest.mark.parametrize(
    "seqlens, accept_all",
    [
        ([], True),                      # empty budget: no request, no row
        ([1] * 9, True),                 # no drafts anywhere (plain decode)
        ([6, 6, 6], True),               # everything accepted
        ([6, 6, 6], False),              # everything rejected
        ([1, 6, 1, 2, 1], True),
        ([2, 1, 3, 1], False),
    ],
)
def test_edge_batches(seqlens, accept_all):
    total = sum(seqlens)
    check_against_oracle(seqlens, [accept_all] * total, list(range(1000, 1000 + total)))


def test_all_accepted_and_all_rejected_counts():
    _, _, fin = run_pipeline([6, 3], [True] * 9, list(range(9)))
    assert fin.num_accepted.tolist() == [5, 2] and fin.final_row.tolist() == [5, 8]
    _, _, fin = run_pipeline([6, 3], [False] * 9, list(range(9)))
    assert fin.num_accepted.tolist() == [0, 0] and fin.final_row.tolist() == [0, 6]
    assert fin.verified_token_ids.tolist() == [VERIFIED_END] * 9


def test_accepts_after_a_rejection_do_not_count():
    """The prefix rule: a draft accepted on its own after a rejected one is discarded."""
    _, (effective, is_final), fin = run_pipeline([5], [True, False, True, True, True], [7, 8, 9, 10, 0])
    assert effective.tolist() == [True, False, False, False, False]
    assert fin.verified_token_ids.tolist() == [7, -1, -1, -1, -1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 7), max_size=16), st.randoms(use_true_random=False))
def test_random_ragged_batches(seqlens, rnd):
    total = sum(seqlens)
    raw = [rnd.random() < 0.7 for _ in range(total)]
    drafts = [rnd.randrange(0, 50000) for _ in range(total)]
    check_against_oracle(seqlens, raw, drafts)


def test_large_batch_vectorised():
    """One global cumsum over thousands of requests matches the loop."""
    g = torch.Generator().manual_seed(0)
    seqlens = torch.randint(1, 7, (3000,), generator=g).tolist()
    total = sum(seqlens)
    raw = (torch.rand(total, generator=g) < 0.8).tolist()
    drafts = torch.randint(0, 1 << 20, (total,), generator=g).tolist()
    check_against_oracle(seqlens, raw, drafts)


def test_int64_drafts_accepted():
    ftp, s, total_q = make_layout([3])
    row_to_req, _, is_verify = prepare_verification_metadata(ftp, s, total_q)
    eff, fin_mask = get_accept_result(torch.ones(3, dtype=torch.bool), is_verify, ftp, row_to_req)
    fin = finalize_verification(eff, fin_mask, is_verify, torch.tensor([5, 6, 7]), ftp, row_to_req)
    assert fin.verified_token_ids.dtype == torch.int32 and fin.verified_token_ids.tolist() == [5, 6, -1]


# ---------------------------------------------------------------- argument checks


def test_layout_errors_name_the_argument():
    ftp, s, total_q = make_layout([2, 3])
    with pytest.raises(ValueError, match="ftp must be the exclusive prefix sum"):
        prepare_verification_metadata(torch.tensor([0, 1], dtype=torch.int32), s, total_q)
    with pytest.raises(ValueError, match=r"sum\(seqlens_q\) = 5 but total_q = 6"):
        prepare_verification_metadata(ftp, s, 6)
    with pytest.raises(ValueError, match=r"seqlens_q\[0\] = 0"):
        prepare_verification_metadata(torch.tensor([0, 0], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32), 3)
    with pytest.raises(TypeError, match="ftp must have dtype int32"):
        prepare_verification_metadata(ftp.long(), s, total_q)
    with pytest.raises(ValueError, match=r"seqlens_q must have shape \[req_cnt\]"):
        prepare_verification_metadata(ftp, s[:1], total_q)
    with pytest.raises(ValueError, match="total_q = 4"):
        prepare_verification_metadata(torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 4)
    row_to_req, _, is_verify = prepare_verification_metadata(ftp, s, total_q)
    with pytest.raises(ValueError, match=r"is_verify must have shape \[total_q\]"):
        get_accept_result(torch.ones(5, dtype=torch.bool), is_verify[:4], ftp, row_to_req)
    with pytest.raises(TypeError, match="raw_accept must have dtype bool"):
        get_accept_result(torch.ones(5, dtype=torch.int32), is_verify, ftp, row_to_req)
    eff, fin_mask = get_accept_result(torch.ones(5, dtype=torch.bool), is_verify, ftp, row_to_req)
    with pytest.raises(ValueError, match=r"draft_token_ids must have shape \[total_q\]"):
        finalize_verification(eff, fin_mask, is_verify, torch.zeros(4, dtype=torch.int32), ftp, row_to_req)
