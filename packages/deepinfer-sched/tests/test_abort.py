"""Abort in every phase frees blocks and slot within one step and emits exactly one final output."""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, RequestOutputPool, RequestParams, StepKind
from deepinfer_sched.testing import small_scheduler

NUM_BLOCKS = 64


def make():
    return small_scheduler(num_blocks=NUM_BLOCKS, max_num_batched_tokens=8, nextn=2)


def run(s, pool, out):
    pushed = s.process_outputs(out, np.full(out.req_cnt, 9, np.int32), np.full(out.total_q, VERIFIED_END, np.int32))
    h = s.build_request_outputs(out, pushed, pool, first_token_positions=out.first_token_pos)
    outs = [pool.get(x).clone() for x in h]
    pool.release(h)
    return pushed, outs


def finals_of(outs, rid):
    return [o for o in outs if o.request_id == rid and o.finished]


def assert_freed(s):
    assert s.num_free_blocks() == NUM_BLOCKS and s.num_used_mtp_slots() == 0 and s.num_running() == 0


def test_abort_waiting():
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5] * 6, RequestParams())
    assert s.abort_request(1) and not s.abort_request(1)
    out = s.schedule()
    assert out.step_kind == StepKind.IDLE and list(out.aborted_request_ids) == [1]
    _, outs = run(s, pool, out)
    assert len(outs) == 1 and outs[0].finish_reason == "abort" and outs[0].token_id is None
    assert outs[0].num_output_tokens == 0
    assert not s.has_unfinished()
    assert_freed(s)


def test_abort_mid_chunked_prefill():
    s, pool = make(), RequestOutputPool()
    s.add_request(1, list(range(3, 23)), RequestParams())  # 20 tokens, budget 8
    run(s, pool, s.schedule())
    seq = s.get_sequence(1)
    assert seq.needs_prefill and seq.info_slot >= 1 and len(seq.block_table) == 5
    assert s.abort_request(1)
    assert_freed(s)  # immediately
    _, outs = run(s, pool, s.schedule())
    assert len(outs) == 1 and outs[0].finish_reason == "abort"


def test_abort_running():
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=10))
    s.add_request(2, [5, 6, 7], RequestParams(max_tokens=10))
    run(s, pool, s.schedule())
    run(s, pool, s.schedule())
    assert s.abort_request(1)
    assert s.num_running() == 1 and s.num_used_mtp_slots() == 1
    out = s.schedule()
    assert list(out.request_ids) == [2] and list(out.aborted_request_ids) == [1]
    _, outs = run(s, pool, out)
    fin = finals_of(outs, 1)
    assert len(fin) == 1 and fin[0].num_output_tokens == 2 and fin[0].token_id is None
    while s.has_unfinished():
        _, outs = run(s, pool, s.schedule())
        assert not [o for o in outs if o.request_id == 1]


@pytest.mark.parametrize("flight", ["one", "two"])
def test_abort_in_flight_under_zos(flight):
    """ZOS: schedule(N+1) runs before process_outputs(N); abort lands while N (and N+1) fly."""
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=10))
    run(s, pool, s.schedule())  # prefill
    out_n = s.schedule()  # decode N, in flight
    inflight = [out_n]
    if flight == "two":
        inflight.append(s.schedule())  # N+1 also scheduled before N is processed
        assert s.get_sequence(1).num_inflight_steps == 2
    assert s.abort_request(1)
    assert_freed(s)
    outs = []
    for o in inflight:  # process the in-flight steps: the aborted request pushes 0
        pushed, got = run(s, pool, o)
        assert list(pushed) == [0]
        outs += got
    out = s.schedule()
    assert list(out.aborted_request_ids) == [1]
    _, got = run(s, pool, out)
    outs += got
    assert len(outs) == 1 and outs[0].finish_reason == "abort" and outs[0].num_output_tokens == 1
    assert not s.has_unfinished()


def test_abort_of_finished_or_unknown_is_a_no_op():
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5], RequestParams(max_tokens=1))
    run(s, pool, s.schedule())
    assert not s.abort_request(1) and not s.abort_request(42)
    assert not s.has_unfinished()
