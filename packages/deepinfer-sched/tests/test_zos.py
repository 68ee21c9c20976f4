"""Zero-overhead scheduling: schedule(N+1) before process_outputs(N). The counter timeline of
csrc/sequence.hpp, remap, finish-in-flight pushing 0, and prepare_zos_inputs."""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, RequestOutputPool, RequestParams, prepare_zos_inputs
from deepinfer_sched.testing import small_scheduler


def make(nextn=2):
    return small_scheduler(nextn=nextn)


def verified(out, accepted):
    v = np.full(out.total_q, VERIFIED_END, np.int32)
    for i, toks in enumerate(accepted):
        v[out.first_token_pos[i] : out.first_token_pos[i] + len(toks)] = toks
    return v


def test_counter_timeline_of_the_diagram():
    s = make()
    s.add_request(1, list(range(3, 12)), RequestParams(max_tokens=50))  # 9 prompt tokens
    pre = s.schedule()
    s.process_outputs(pre, [12])  # L = 10, committed 9
    seq = s.get_sequence(1)
    assert (len(seq.token_ids), seq.num_tokens) == (10, 9)

    n = s.schedule()  # rows 9 10 11
    assert list(n.positions) == [9, 10, 11] and list(n.input_token_ids) == [12, -1, -1]
    seq = s.get_sequence(1)
    assert (seq.num_tokens, seq.num_uncommitted_rows) == (12, 3)
    n1 = s.schedule()  # upper bound: rows 12 13 14; golden unknown on the CPU
    assert list(n1.positions) == [12, 13, 14] and list(n1.input_token_ids) == [-1, -1, -1]
    assert list(n1.remap) == [0] and list(n1.num_uncommitted_rows) == [3]
    seq = s.get_sequence(1)
    assert (seq.num_tokens, seq.num_uncommitted_rows, seq.num_inflight_steps) == (15, 6, 2)

    pushed = s.process_outputs(n, [21], verified(n, [[20]]))  # keeps 2 rows
    assert list(pushed) == [2]
    seq = s.get_sequence(1)
    assert (len(seq.token_ids), seq.num_tokens, seq.num_uncommitted_rows) == (12, 14, 3)
    # The device runs N+1 at its true start: CPU position minus the rows N rejected.
    assert n1.positions[0] - (n.seqlens_q[0] - n.kept_rows[0]) == 11 == len(seq.token_ids) - 1

    pushed = s.process_outputs(n1, [22], verified(n1, [[]]))  # keeps 1 row
    seq = s.get_sequence(1)
    assert (len(seq.token_ids), seq.num_tokens, seq.num_uncommitted_rows) == (13, 12, 0)
    assert seq.num_tokens == len(seq.token_ids) - 1 and seq.output_token_ids == [12, 20, 21, 22]
    n2 = s.schedule()
    assert list(n2.positions) == [12, 13, 14] and list(n2.input_token_ids) == [22, -1, -1]
    assert list(n2.remap) == [0] and list(n2.num_uncommitted_rows) == [0]


def test_finish_in_step_n_pushes_zero_in_n_plus_1():
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=50))
    s.add_request(2, [5, 6, 7], RequestParams(max_tokens=50))
    s.process_outputs(s.schedule(), [9, 9])
    n = s.schedule()
    n1 = s.schedule()
    i1 = list(n.request_ids).index(1)
    tokens = np.array([9, 9], np.int32)
    tokens[i1] = 2  # EOS for request 1 in step N
    pushed = s.process_outputs(n, tokens, verified(n, [[], []]))
    assert pushed[i1] == 1
    h = s.build_request_outputs(n, pushed, pool)
    assert [pool.get(x).finish_reason for x in h if pool.get(x).request_id == 1] == ["stop"]
    pool.release(h)
    assert s.get_sequence(1) is None and s.num_running() == 1 and s.num_used_mtp_slots() == 1
    pushed1 = s.process_outputs(n1, [9, 9], verified(n1, [[], []]))
    assert pushed1[list(n1.request_ids).index(1)] == 0
    h = s.build_request_outputs(n1, pushed1, pool)
    assert all(pool.get(x).request_id == 2 for x in h)
    pool.release(h)


def test_blocks_cover_the_optimistic_upper_bound():
    s = make(nextn=3)
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=50))
    s.process_outputs(s.schedule(), [9])
    s.schedule()
    n1 = s.schedule()
    assert n1.context_lens[0] == 3 + 4 + 4
    assert (n1.block_tables[0] >= 0).sum() * 4 >= n1.context_lens[0]


def test_remap_matches_prepare_zos_inputs():
    s = make(nextn=1)
    for r in range(3):
        s.add_request(r, [5, 6, 7], RequestParams(max_tokens=50))
    prev = s.schedule()
    s.process_outputs(prev, [9, 9, 9])
    cur = s.schedule()
    assert np.array_equal(cur.remap, prepare_zos_inputs(prev.request_ids, cur.request_ids))
    s.add_request(7, [5, 6], RequestParams(max_tokens=5))
    s.process_outputs(cur, [9, 9, 9], verified(cur, [[], [], []]))
    nxt = s.schedule()  # a prefill step of request 7 only
    assert np.array_equal(nxt.remap, prepare_zos_inputs(cur.request_ids, nxt.request_ids))
    assert list(nxt.remap) == [-1]


def test_prepare_zos_inputs():
    assert list(prepare_zos_inputs(np.array([7, 3, 9]), np.array([3, 5, 7]))) == [1, -1, 0]
    assert list(prepare_zos_inputs(np.array([], np.int64), np.array([1]))) == [-1]
    with pytest.raises(ValueError, match="repeats"):
        prepare_zos_inputs(np.array([1, 1]), np.array([1]))


def test_processing_twice_or_out_of_shape_fails_loudly():
    from deepinfer_sched import LedgerError

    s = make()
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=50))
    out = s.schedule()
    with pytest.raises(ValueError, match="token_ids"):
        s.process_outputs(out, [9, 9])
    s.process_outputs(out, [9])
    with pytest.raises(LedgerError, match="already processed"):
        s.process_outputs(out, [9])
    d = s.schedule()
    bad = np.array([VERIFIED_END, 4, VERIFIED_END], np.int32)  # a token after the terminator
    with pytest.raises(LedgerError, match="request 1.*contiguous"):
        s.process_outputs(d, [9], bad)
    with pytest.raises(LedgerError, match="final row"):
        s.process_outputs(d, [9], np.array([4, 5, 6], np.int32))
    with pytest.raises(LedgerError, match="main token"):
        s.process_outputs(d, [-5])
    seq = s.get_sequence(1)
    assert seq.num_uncommitted_rows == 3 and len(seq.token_ids) == 4  # nothing was committed
    s.process_outputs(d, [9], np.array([4, VERIFIED_END, VERIFIED_END], np.int32))
    assert s.get_sequence(1).output_token_ids == [9, 4, 9]


def test_preempted_while_in_flight_pushes_zero_and_recomputes():
    s = small_scheduler(num_blocks=5, max_model_len=16, nextn=1)
    pool = RequestOutputPool()
    s.add_request(1, [5] * 6, RequestParams(max_tokens=8))  # A
    s.add_request(2, [6] * 6, RequestParams(max_tokens=8))  # B
    s.process_outputs(s.schedule(), [9, 9])  # 2 blocks each
    n = s.schedule()  # both decode (8 tokens: still 2 blocks each)
    n1 = s.schedule()  # 10 tokens: 3 blocks each > 5: B (LCFS first) grows, A preempts itself
    assert list(n1.preempted_request_ids) == [1] and list(n1.request_ids) == [2]
    a = s.get_sequence(1)
    assert a.num_tokens == 0 and a.epoch == 1 and a.info_slot == 0 and a.block_table == []
    pushed = s.process_outputs(n, [9, 9], verified(n, [[], []]))
    assert pushed[list(n.request_ids).index(1)] == 0  # A's in-flight step is void
    assert pushed[list(n.request_ids).index(2)] == 1
    assert s.get_sequence(1).output_token_ids == [9] and s.get_sequence(1).num_tokens == 0
    h = s.build_request_outputs(n, pushed, pool)
    assert [pool.get(x).request_id for x in h] == [2]
    pool.release(h)
    s.process_outputs(n1, [9], verified(n1, [[]]))
    assert s.num_used_mtp_slots() == s.num_running() == 1
