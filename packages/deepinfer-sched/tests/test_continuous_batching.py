"""Issue 2 slice: admission under the token budget and max_num_seqs, chunked prefill (with the
YOCO final-chunk rule), finish on EOS / max_tokens / stop ids, ignored prompts."""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, RequestOutputPool, RequestParams, SequenceStatus, StepKind
from deepinfer_sched.testing import small_scheduler

EOS = 2


def make(**kw):
    return small_scheduler(**{"num_blocks": 128, "max_num_batched_tokens": 16, "eos_token_ids": [EOS], **kw})


def step(s, pool, tokens=None, out=None):
    """Run one step where every request samples `tokens` (default 9); returns (out, outputs)."""
    out = out or s.schedule()
    tok = np.full(out.req_cnt, 9 if tokens is None else tokens, np.int32)
    pushed = s.process_outputs(out, tok, np.full(out.total_q, VERIFIED_END, np.int32))
    handles = s.build_request_outputs(out, pushed, pool, first_token_positions=out.first_token_pos)
    outs = [pool.get(h).clone() for h in handles]
    pool.release(handles)
    return out, outs


def test_admission_respects_max_num_seqs_and_token_budget():
    s, pool = make(max_num_seqs=2, max_num_batched_tokens=10), RequestOutputPool()
    for rid in range(4):
        s.add_request(rid, [5] * 4, RequestParams(max_tokens=3))
    out, _ = step(s, pool)
    assert out.step_kind == StepKind.PREFILL and list(out.request_ids) == [0, 1]  # max_num_seqs
    assert s.num_running() == 2 and s.num_waiting() == 2
    out, _ = step(s, pool)
    assert out.step_kind == StepKind.DECODE and sorted(out.request_ids) == [0, 1]


def test_token_budget_chunks_prompts_and_is_never_exceeded():
    s, pool = make(max_num_batched_tokens=8), RequestOutputPool()
    s.add_request(1, list(range(3, 23)), RequestParams(max_tokens=2))  # 20 tokens
    s.add_request(2, [5, 6, 7], RequestParams(max_tokens=2))
    seen = []
    while s.has_unfinished():
        out, _ = step(s, pool)
        assert out.total_q <= 8
        seen.append((out.step_kind, list(out.request_ids), list(out.seqlens_q), list(out.is_last_chunk)))
    assert seen[0] == (StepKind.PREFILL, [1], [8], [False])
    assert seen[1] == (StepKind.PREFILL, [1], [8], [False])
    assert seen[2] == (StepKind.PREFILL, [1, 2], [4, 3], [True, True])  # continuing chunk first, then admit


def test_yoco_final_chunk_holds_min_final_chunk_tokens():
    s, pool = make(max_num_batched_tokens=8, min_final_chunk_tokens=6), RequestOutputPool()
    s.add_request(1, list(range(3, 23)), RequestParams(max_tokens=1))  # 20 tokens
    chunks = []
    while s.has_unfinished():
        out, _ = step(s, pool)
        chunks.append(int(out.seqlens_q[0]))
    # 8 + 8 would leave 4 < 6: the second chunk is shortened to 6 so the last holds 6.
    assert chunks == [8, 6, 6]
    s.add_request(2, [4, 5, 6], RequestParams(max_tokens=1))  # shorter than the rule: one chunk
    out, _ = step(s, pool)
    assert list(out.seqlens_q) == [3]


def test_min_final_chunk_must_fit_the_budget():
    with pytest.raises(ValueError, match="min_final_chunk_tokens"):
        make(max_num_batched_tokens=8, min_final_chunk_tokens=9)


@pytest.mark.parametrize(
    "params,tokens,reason,n_out",
    [
        (RequestParams(max_tokens=3), [9, 9, 9, 9], "length", 3),
        (RequestParams(max_tokens=8), [9, EOS, 9], "stop", 2),
        (RequestParams(max_tokens=8, ignore_eos=True), [EOS, EOS, 9, 9, 9, 9, 9, 9], "length", 8),
        (RequestParams(max_tokens=8, min_tokens=3), [EOS, EOS, EOS, 9], "stop", 3),
        (RequestParams(max_tokens=8, stop_token_ids=[7]), [9, 9, 7, 9], "stop", 3),
        (RequestParams(max_tokens=8, stop_token_ids=[7], min_tokens=4), [7, 7, 7, 7, 9], "stop", 4),
    ],
)
def test_finish_conditions(params, tokens, reason, n_out):
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5, 6, 7], params)
    outs = []
    for t in tokens:
        if not s.has_unfinished():
            break
        outs += step(s, pool, tokens=t)[1]
    assert not s.has_unfinished()
    assert len(outs) == n_out and [o.num_output_tokens for o in outs] == list(range(1, n_out + 1))
    assert [o.finished for o in outs] == [False] * (n_out - 1) + [True]
    assert outs[-1].finish_reason == reason
    if reason == "stop":
        assert outs[-1].stop_token_id == tokens[n_out - 1]
    assert s.num_free_blocks() == 128


def test_max_model_len_finishes_with_length():
    s, pool = make(max_model_len=6), RequestOutputPool()
    s.add_request(1, [5, 6, 7, 8], RequestParams(max_tokens=100))
    outs = []
    while s.has_unfinished():
        outs += step(s, pool)[1]
    assert len(outs) == 2 and outs[-1].finish_reason == "length"


def test_stop_inside_accepted_drafts_stops_pushing():
    s, pool = make(nextn=3), RequestOutputPool()
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=20))
    step(s, pool)
    out = s.schedule()
    assert list(out.seqlens_q) == [4]
    verified = np.array([9, EOS, 9, VERIFIED_END], np.int32)
    pushed = s.process_outputs(out, [9], verified)
    assert list(pushed) == [2]  # 9, EOS: the third accepted draft and the main token are dropped
    h = s.build_request_outputs(out, pushed, pool, first_token_positions=out.first_token_pos)
    outs = [pool.get(x) for x in h]
    assert [o.token_id for o in outs] == [9, EOS] and outs[-1].finish_reason == "stop"
    assert (outs[-1].draft_tok, outs[-1].accept_tok) == (4, 4)


def test_ignored_prompt_gets_one_output_and_never_runs():
    s, pool = make(max_model_len=8), RequestOutputPool()
    s.add_request(1, list(range(3, 13)), RequestParams(max_tokens=4))  # 10 > 8
    s.add_request(2, [5, 6], RequestParams(max_tokens=1))
    assert s.get_sequence(1) is None and s.has_unfinished()
    out, outs = step(s, pool)
    assert list(out.ignored_request_ids) == [1] and list(out.request_ids) == [2]
    ign = [o for o in outs if o.request_id == 1]
    assert len(ign) == 1
    o = ign[0]
    assert o.finished and o.finish_reason == "prompt_length_exceeded"
    assert o.token_id == 12 and o.num_output_tokens == 1 and o.prompt_len == 10
    while s.has_unfinished():
        out, outs = step(s, pool)
        assert 1 not in out.request_ids


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(max_tokens=2, min_tokens=3), "min_tokens"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
    ],
)
def test_bad_request_params_raise_value_error(kw, match):
    s = make()
    with pytest.raises(ValueError, match=match):
        s.add_request(1, [5], RequestParams(**kw))
    assert not s.has_unfinished()


def test_bad_prompts_and_ids_raise_value_error():
    s = make()
    with pytest.raises(ValueError, match="must not be empty"):
        s.add_request(1, [], RequestParams())
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\]"):
        s.add_request(1, [5, -1], RequestParams())
    s.add_request(1, [5], RequestParams())
    with pytest.raises(ValueError, match="already"):
        s.add_request(1, [5], RequestParams())
    with pytest.raises(ValueError, match="num_drafts"):
        s.set_num_drafts([1], [1])  # nextn = 0


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(block_size=0), "block_size"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(nextn=17), "nextn"),
        (dict(num_blocks=4), "num_blocks"),
        (dict(eos_token_ids=[-1]), "eos_token_ids"),
        (dict(engram_vocab_map=[0, -2]), "engram_vocab_map"),
    ],
)
def test_bad_config_raises_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


def test_engram_ids_follow_every_token():
    vmap = [i // 2 for i in range(32)]  # token -> compressed class
    s, pool = make(engram_vocab_map=vmap), RequestOutputPool()
    s.add_request(1, [5, 6, 7], RequestParams(max_tokens=3))
    out, _ = step(s, pool, tokens=9)
    assert list(out.input_engram_ids) == [2, 3, 3]
    out, _ = step(s, pool, tokens=10)
    assert list(out.input_token_ids) == [9] and list(out.input_engram_ids) == [4]
    seq = s.get_sequence(1)
    assert seq.compressed_token_ids == [vmap[t] for t in seq.token_ids]
    with pytest.raises(ValueError, match="engram_vocab_map"):
        s.add_request(2, [40], RequestParams())


def test_status_and_counters_of_a_running_sequence():
    s, pool = make(), RequestOutputPool()
    s.add_request(1, [5, 6, 7, 8, 9], RequestParams(max_tokens=5))
    out = s.schedule()
    seq = s.get_sequence(1)
    assert seq.status == SequenceStatus.RUNNING and seq.num_tokens == 5 and seq.previous_num_tokens == 0
    assert seq.num_uncommitted_rows == 5 and seq.needs_prefill is False
    step(s, pool, out=out)
    seq = s.get_sequence(1)
    assert seq.num_committed_tokens == 5 and seq.token_ids == [5, 6, 7, 8, 9, 9]
