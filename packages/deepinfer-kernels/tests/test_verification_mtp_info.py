"""MTP info pool: store to slot * nextn + j, never touch slot 0; read rows for the next step."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.verification import (
    MTP_PADDING_ROW,
    MtpInfoPool,
    mtp_info_read_rows,
    read_mtp_info,
    store_mtp_info,
)

PAD_TOKEN, PAD_CONF, PAD_PROB = 77, -3.0, -5.0


def padded_pool(max_num_seqs: int, nextn: int, width: int | None = None, sparse: bool = False) -> MtpInfoPool:
    pool = MtpInfoPool.allocate(max_num_seqs, nextn, prob_width=width, sparse=sparse)
    pool.token_ids[:nextn] = PAD_TOKEN  # recognisable padding content in slot 0
    pool.confidence[:nextn] = PAD_CONF
    if pool.draft_probs is not None:
        pool.draft_probs[:nextn] = PAD_PROB
    return pool


def test_store_writes_slot_rows_and_never_slot_zero():
    nextn, width = 3, 5
    pool = padded_pool(6, nextn, width)
    assert pool.token_ids.shape == ((6 + 1) * nextn,)
    g = torch.Generator().manual_seed(0)
    slots = torch.tensor([4, 0, 2, 0, 6], dtype=torch.int32)  # two requests without a slot
    drafts = torch.randint(0, 1000, (5, nextn), generator=g, dtype=torch.int32)
    conf = torch.rand(5, nextn, generator=g)
    probs = torch.rand(5, nextn, width, generator=g)
    store_mtp_info(slots, drafts, pool, confidence=conf, draft_probs=probs)
    for i, s in enumerate(slots.tolist()):
        if s == 0:
            continue
        for j in range(nextn):
            assert int(pool.token_ids[s * nextn + j]) == int(drafts[i, j])
            assert float(pool.confidence[s * nextn + j]) == float(conf[i, j])
            assert torch.equal(pool.draft_probs[s * nextn + j], probs[i, j])
    assert (pool.token_ids[:nextn] == PAD_TOKEN).all()
    assert (pool.confidence[:nextn] == PAD_CONF).all()
    assert (pool.draft_probs[:nextn] == PAD_PROB).all()
    untouched = [1, 3, 5]
    for s in untouched:
        assert (pool.token_ids[s * nextn:(s + 1) * nextn] == 0).all()


def test_only_padding_slots_is_a_no_op():
    pool = padded_pool(2, 2)
    before = pool.token_ids.clone()
    store_mtp_info(torch.zeros(3, dtype=torch.int32), torch.ones(3, 2, dtype=torch.int32), pool)
    assert torch.equal(pool.token_ids, before)
    store_mtp_info(torch.zeros(0, dtype=torch.int32), torch.ones(0, 2, dtype=torch.int32), pool)
    assert torch.equal(pool.token_ids, before)


def test_sparse_topk_fields():
    pool = padded_pool(3, 2, width=4, sparse=True)
    vals = torch.rand(1, 2, 4)
    ids = torch.randint(0, 100, (1, 2, 4), dtype=torch.int32)
    store_mtp_info(torch.tensor([3], dtype=torch.int32), torch.tensor([[5, 6]]), pool, draft_probs=vals,
                   draft_prob_ids=ids)
    assert torch.equal(pool.draft_prob_ids[6:8], ids[0]) and torch.equal(pool.draft_probs[6:8], vals[0])


def test_read_rows_and_round_trip_into_verification():
    """Step N stores blocks; step N+1 verifies 1 + k drafts per request and reads exactly those."""
    nextn = 4
    pool = padded_pool(5, nextn, width=6)
    slots = torch.tensor([2, 5, 1], dtype=torch.int32)
    drafts = torch.arange(12, dtype=torch.int32).reshape(3, nextn) + 100
    probs = torch.rand(3, nextn, 6)
    store_mtp_info(slots, drafts, pool, draft_probs=probs)
    seqlens = torch.tensor([5, 1, 3], dtype=torch.int32)  # verify 4, 0 and 2 drafts
    ftp = torch.tensor([0, 5, 6], dtype=torch.int32)
    rows = mtp_info_read_rows(slots, ftp, seqlens, 9, nextn)
    assert rows.dtype == torch.int64
    assert rows.tolist() == [8, 9, 10, 11, MTP_PADDING_ROW, MTP_PADDING_ROW, 4, 5, MTP_PADDING_ROW]
    ids, q = read_mtp_info(rows, pool)
    assert ids.tolist() == [100, 101, 102, 103, PAD_TOKEN, PAD_TOKEN, 108, 109, PAD_TOKEN]
    assert torch.equal(q[0], probs[0, 0]) and torch.equal(q[7], probs[2, 1])


def test_argument_errors():
    pool = padded_pool(3, 2)
    with pytest.raises(ValueError, match="two requests write the same slot"):
        store_mtp_info(torch.tensor([1, 1], dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), pool)
    with pytest.raises(ValueError, match=r"write_slots must lie in \[0, max_num_seqs=3\]"):
        store_mtp_info(torch.tensor([4], dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32), pool)
    with pytest.raises(ValueError, match=r"draft_token_ids must have shape \[req_cnt, nextn=2\]"):
        store_mtp_info(torch.tensor([1], dtype=torch.int32), torch.zeros(1, 3, dtype=torch.int32), pool)
    with pytest.raises(ValueError, match="pool.draft_probs was not allocated"):
        store_mtp_info(torch.tensor([1], dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32), pool,
                       draft_probs=torch.zeros(1, 2, 4))
    ftp, s = torch.tensor([0], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    with pytest.raises(ValueError, match="must have a read slot >= 1"):
        mtp_info_read_rows(torch.tensor([0], dtype=torch.int32), ftp, s, 2, 2)
    with pytest.raises(ValueError, match=r"seqlens_q must be <= nextn \+ 1 = 2"):
        mtp_info_read_rows(torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                           torch.tensor([3], dtype=torch.int32), 3, 1)
