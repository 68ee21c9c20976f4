"""Prefix caching at block grain (hash chain, ref counts, LRU eviction) and LCFS decode with
preemption-by-recompute of the shortest-output sequence."""

import numpy as np

from deepinfer_sched import VERIFIED_END, RequestParams, Sequence, SequenceStatus
from deepinfer_sched.testing import small_scheduler


def make(**kw):
    return small_scheduler(**{"max_num_seqs": 8, "max_model_len": 48, **kw})


def process(s, out, tok=9):
    return s.process_outputs(out, np.full(out.req_cnt, tok, np.int32), np.full(out.total_q, VERIFIED_END, np.int32))


PROMPT = list(range(3, 14))  # 11 tokens = 2 full blocks + 3


def test_shared_prefix_is_reused_with_ref_counts():
    s = make()
    s.add_request(1, PROMPT, RequestParams(max_tokens=10))
    process(s, s.schedule())
    a = s.get_sequence(1)
    assert a.num_hashed_blocks == 2 and s.num_cached_blocks() == 2
    s.add_request(2, PROMPT[:8] + [20, 21, 22], RequestParams(max_tokens=10))
    out = s.schedule()
    assert list(out.num_computed_tokens) == [8] and list(out.seqlens_q) == [3]  # 2 blocks hit
    b = s.get_sequence(2)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert s.block_ref_count(a.block_table[0]) == 2


def test_finished_blocks_stay_cached_until_evicted_lru():
    s = make(num_blocks=16, max_model_len=16)
    s.add_request(1, PROMPT, RequestParams(max_tokens=1))
    process(s, s.schedule())
    assert s.get_sequence(1) is None and s.num_free_blocks() == 16 and s.num_cached_blocks() == 2
    s.add_request(2, PROMPT, RequestParams(max_tokens=1))  # same prompt: hit after finish
    out = s.schedule()
    assert list(out.num_computed_tokens) == [8]
    process(s, out)
    # Fill the pool with unrelated prompts: plain free blocks go first, then the LRU cached ones.
    for r in range(3, 8):
        s.add_request(r, [30 + r] * 11, RequestParams(max_tokens=1))
    process(s, s.schedule())  # 15 blocks: 14 plain + 1 evicted
    assert s.num_free_blocks() == 16
    s.add_request(9, PROMPT, RequestParams(max_tokens=1))
    # Tables are freed tail first, so the tail block was least recent and went first: the head
    # block still hits (the chain is intact up to it).
    assert list(s.schedule().num_computed_tokens) == [4]


def test_yoco_caps_the_prefix_hit():
    s = make(min_final_chunk_tokens=6)
    s.add_request(1, PROMPT, RequestParams(max_tokens=1))
    process(s, s.schedule())
    s.add_request(2, PROMPT, RequestParams(max_tokens=1))
    out = s.schedule()
    # 11 tokens, last chunk must hold 6: the hit is capped at 4 (one block).
    assert list(out.num_computed_tokens) == [4] and list(out.seqlens_q) == [7]


def test_preemption_takes_shortest_output_and_recomputes():
    # 3 sequences, a pool that holds only two of them once they grow.
    s = make(num_blocks=14, max_model_len=40, nextn=0)
    s.add_request(1, [5] * 12, RequestParams(max_tokens=30))
    process(s, s.schedule())
    for _ in range(3):
        process(s, s.schedule())  # request 1: 4 outputs
    s.add_request(2, [6] * 12, RequestParams(max_tokens=30))
    s.add_request(3, [7] * 12, RequestParams(max_tokens=30))
    process(s, s.schedule())  # both admitted (1 output each)
    preempted = []
    for _ in range(10):
        out = s.schedule()
        preempted += list(out.preempted_request_ids)
        process(s, out)
        if preempted:
            break
    # LCFS: request 3 is served first; the victim is the shortest output among the unscheduled.
    assert preempted and preempted[0] in (2, 3) and 1 not in preempted
    victim = s.get_sequence(preempted[0])
    assert victim.status == SequenceStatus.WAITING and victim.num_tokens == 0 and victim.block_table == []
    assert victim.info_slot == 0 and victim.epoch == 1 and victim.prefill_len == len(victim.token_ids)
    while s.has_unfinished():
        out = s.schedule()
        process(s, out)
    assert s.num_free_blocks() == 14


def test_reset_for_recompute_resets_every_rolling_field():
    seq = Sequence(5, [1, 2, 3], RequestParams(max_tokens=4))
    seq.advance_optimistically(3)
    seq.append_token_id(7)
    seq.commit_processed_tokens(3, 3)
    seq.advance_optimistically(2)
    assert (seq.num_tokens, seq.previous_num_tokens, seq.num_uncommitted_rows, seq.num_inflight_steps) == (5, 3, 2, 1)
    seq.reset_for_recompute()
    assert (seq.num_tokens, seq.previous_num_tokens, seq.num_uncommitted_rows, seq.num_inflight_steps) == (0, 0, 0, 0)
    assert seq.status == SequenceStatus.WAITING and seq.epoch == 1 and seq.prefill_len == 4
    assert seq.info_slot == 0 and seq.last_output_token == -1 and seq.prev_confidence == []
    assert seq.num_hashed_blocks == 0 and seq.token_ids == [1, 2, 3, 7]


def test_commit_more_than_scheduled_fails_loudly():
    import pytest

    from deepinfer_sched import LedgerError

    seq = Sequence(5, [1, 2, 3], RequestParams())
    with pytest.raises(LedgerError, match="no step in flight"):
        seq.commit_processed_tokens(1, 1)
    seq.advance_optimistically(2)
    with pytest.raises(LedgerError, match="request 5: commit keeps 3 of 2"):
        seq.commit_processed_tokens(2, 3)
