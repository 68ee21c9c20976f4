"""Seed 000's worked example ("一个完整的走账例子"), reproduced exactly.

Requests A, B, C verify 3, 1 and 0 drafts (seqlen_q 4, 2, 1). A accepts 2 drafts and reaches
max_tokens on its third token; B's draft is rejected; C has none. (The seed's parenthetical says
A had max_tokens - 1 outputs before the step, which contradicts pushed = 3; we follow the
consistent reading: A had max_tokens - 3, so its third token hits the limit.)
"""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, RequestOutputPool, RequestParams, StepKind
from deepinfer_sched.testing import small_scheduler

A, B, C = 100, 200, 300
T1, T2, T3, MAIN_A, MAIN_B, MAIN_C, DRAFT_B = 11, 12, 13, 21, 22, 23, 14


@pytest.fixture()
def decode_step():
    s = small_scheduler(max_num_seqs=8, nextn=3, min_final_chunk_tokens=4)
    s.add_request(A, [5, 6, 7, 8, 9], RequestParams(max_tokens=4))  # 1 output after prefill = 4 - 3
    s.add_request(B, [5, 6, 7], RequestParams(max_tokens=10))
    s.add_request(C, [5, 6, 7, 8], RequestParams(max_tokens=10))
    pool = RequestOutputPool()
    pre = s.schedule()
    assert pre.step_kind == StepKind.PREFILL and list(pre.request_ids) == [A, B, C]
    pushed = s.process_outputs(pre, [3, 3, 3])
    pool.release(s.build_request_outputs(pre, pushed, pool))
    s.set_num_drafts([A, B, C], [3, 1, 0])
    return s, pool


def test_worked_example(decode_step):
    s, pool = decode_step
    before = {r: s.get_sequence(r).num_tokens for r in (A, B, C)}
    out = s.schedule()
    assert out.step_kind == StepKind.DECODE
    order = [int(r) for r in out.request_ids]
    # Present the step in the seed's order A, B, C (LCFS schedules C first; rows follow request order).
    assert sorted(order) == [A, B, C]
    idx = {r: order.index(r) for r in (A, B, C)}
    seqlens = {r: int(out.seqlens_q[idx[r]]) for r in (A, B, C)}
    assert seqlens == {A: 4, B: 2, C: 1}
    assert out.total_q == 7
    assert np.array_equal(out.first_token_pos, np.concatenate([[0], np.cumsum(out.seqlens_q)[:-1]]))
    for r in (A, B, C):  # optimistic advance by seqlen_q
        assert s.get_sequence(r).num_tokens == before[r] + seqlens[r]

    verified = np.full(7, VERIFIED_END, np.int32)
    fA = int(out.first_token_pos[idx[A]])
    verified[fA : fA + 2] = [T1, T2]  # A: [t1, t2, -1, -1]; B: [-1, -1]; C: [-1]
    tokens = np.zeros(3, np.int32)
    tokens[idx[A]], tokens[idx[B]], tokens[idx[C]] = MAIN_A, MAIN_B, MAIN_C
    pushed = s.process_outputs(out, tokens, verified)
    assert {r: int(pushed[idx[r]]) for r in (A, B, C)} == {A: 3, B: 1, C: 1}
    # KV commits: 4 -> 3, 2 -> 1, 1 -> 1.
    assert {r: int(out.kept_rows[idx[r]]) for r in (A, B, C)} == {A: 3, B: 1, C: 1}
    for r in (B, C):
        assert s.get_sequence(r).num_tokens == before[r] + 1
    assert s.get_sequence(A) is None  # finished: blocks and slot released

    handles = s.build_request_outputs(out, pushed, pool, first_token_positions=out.first_token_pos)
    outs = [pool.get(h) for h in handles]
    assert len(outs) == 5
    by_req = {r: [o for o in outs if o.request_id == r] for r in (A, B, C)}
    assert [o.token_id for o in by_req[A]] == [T1, T2, MAIN_A]
    assert [o.token_id for o in by_req[B]] == [MAIN_B] and [o.token_id for o in by_req[C]] == [MAIN_C]
    # Outputs are grouped per request, in row-block order, drafts first.
    assert [o.request_id for o in outs] == [r for r in order for _ in range(int(pushed[idx[r]]))]
    assert [o.finished for o in by_req[A]] == [False, False, True]
    assert by_req[A][-1].finish_reason == "length"
    assert not by_req[B][0].finished and not by_req[C][0].finished
    assert [o.num_output_tokens for o in by_req[A]] == [2, 3, 4]
    # Step statistics on A's last output only: draft_tok = rows verified (4), accept_tok = accepted + 1 (3).
    assert [(o.draft_tok, o.accept_tok) for o in by_req[A]] == [(-1, -1), (-1, -1), (4, 3)]
    assert (by_req[B][0].draft_tok, by_req[B][0].accept_tok) == (2, 1)
    assert (by_req[C][0].draft_tok, by_req[C][0].accept_tok) == (1, 1)
    pool.release(handles)


def test_accepted_tokens_without_ftp_is_a_hard_error(decode_step):
    from deepinfer_sched import LedgerError

    s, pool = decode_step
    out = s.schedule()
    verified = np.full(out.total_q, VERIFIED_END, np.int32)
    i = list(out.seqlens_q).index(4)
    verified[out.first_token_pos[i]] = T1
    pushed = s.process_outputs(out, np.full(3, 30, np.int32), verified)
    with pytest.raises(LedgerError, match="first_token_positions"):
        s.build_request_outputs(out, pushed, pool)
    bad = out.first_token_pos.copy()
    bad[1] += 1
    with pytest.raises(LedgerError, match="first_token_positions"):
        s.build_request_outputs(out, pushed, pool, first_token_positions=bad)
    assert pool.num_in_use == 0
    pool.release(s.build_request_outputs(out, pushed, pool, first_token_positions=out.first_token_pos))
