"""The state kind of the KV ledger: one state slot (window rings + compressor stage) per running
sequence, ids 1..max_num_seqs, returned on finish, abort and preemption; misuse fails loudly."""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, LedgerError, RequestParams, Scheduler, SchedulerConfig, StateSlotPool


def make(**kw):
    base = dict(block_size=4, num_blocks=64, max_num_seqs=3, max_num_batched_tokens=64, max_model_len=48,
                nextn=0, min_final_chunk_tokens=0, eos_token_ids=[2])
    base.update(kw)
    return Scheduler(SchedulerConfig(**base))


def process(s, out, tok=9):
    return s.process_outputs(out, np.full(out.req_cnt, tok, np.int32), np.full(out.total_q, VERIFIED_END, np.int32))


def test_pool_take_release_and_loud_misuse():
    p = StateSlotPool(2)
    a, b = p.take(), p.take()
    assert {a, b} == {1, 2} and p.num_used == 2 and not p.can_take()
    with pytest.raises(LedgerError, match="no free state slot"):
        p.take()
    p.release(a)
    with pytest.raises(LedgerError, match="double free"):
        p.release(a)
    with pytest.raises(LedgerError, match="not in use"):
        p.release(0)   # slot 0 is the padding slot, never handed out
    assert p.take() == a and p.num_free == 0


def test_each_running_sequence_holds_one_slot_until_it_finishes():
    s = make()
    for r in range(3):
        s.add_request(r, [5, 6, 7, 8, 9], RequestParams(max_tokens=2 + r))
    out = s.schedule()
    slots = sorted(out.state_slots.tolist())
    assert slots == [1, 2, 3] and s.num_used_state_slots() == 3
    assert [s.get_sequence(r).state_slot for r in out.request_ids.tolist()] == out.state_slots.tolist()
    process(s, out)
    out = s.schedule()            # decode: the same slots, per request
    assert sorted(out.state_slots.tolist()) == [1, 2, 3]
    process(s, out)               # request 0 (max_tokens 2) finishes: its slot returns
    assert s.num_used_state_slots() == 2 and s.get_sequence(0) is None
    assert s.abort_request(2) and s.num_used_state_slots() == 1
    s.add_request(7, [5, 6], RequestParams(max_tokens=1))
    out = s.schedule()            # the new request takes a returned slot
    assert out.state_slots.tolist()[0] in (1, 3) and s.num_used_state_slots() == 2


def test_preemption_returns_the_slot_and_readmission_takes_one():
    s = make(num_blocks=7, max_model_len=24)     # 7 blocks of 4: two sequences of 9 + 12 outputs collide
    for r in range(2):
        s.add_request(r, list(range(3, 12)), RequestParams(max_tokens=12, ignore_eos=True))
    preempted = []
    for _ in range(40):
        if not s.has_unfinished():
            break
        out = s.schedule()
        preempted += out.preempted_request_ids
        assert s.num_used_state_slots() == s.num_running()
        for rid in out.preempted_request_ids:
            assert s.get_sequence(int(rid)).state_slot == 0          # waiting again, nothing held
        process(s, out)
    assert preempted and not s.has_unfinished() and s.num_used_state_slots() == 0
