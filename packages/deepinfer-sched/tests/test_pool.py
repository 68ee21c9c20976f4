"""RequestOutputPool: exhaustion is a clear error, released handles are reused, clones outlive release."""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, RequestOutputPool, RequestParams
from deepinfer_sched.testing import small_scheduler


def outputs(pool, n_req, tokens_each=1):
    s = small_scheduler(max_num_seqs=16, max_model_len=32)
    for r in range(n_req):
        s.add_request(r, [5, 6], RequestParams(max_tokens=4))
    out = s.schedule()
    pushed = s.process_outputs(out, np.full(out.req_cnt, 7, np.int32), np.full(out.total_q, VERIFIED_END, np.int32))
    return s, out, pushed


def test_default_capacity():
    assert RequestOutputPool().capacity == 10_000


def test_exhaustion_raises_a_clear_error_and_allocates_nothing():
    pool = RequestOutputPool(3)
    s, out, pushed = outputs(pool, 4)
    with pytest.raises(RuntimeError, match="RequestOutputPool exhausted.*not being released"):
        s.build_request_outputs(out, pushed, pool)
    assert pool.num_free == 3


def test_released_handles_are_reused_and_stale_handles_rejected():
    pool = RequestOutputPool(4)
    s, out, pushed = outputs(pool, 4)
    h1 = s.build_request_outputs(out, pushed, pool)
    assert pool.num_free == 0 and h1.dtype == np.uint64
    slots1 = sorted(RequestOutputPool.slot_of(int(h)) for h in h1)
    view = pool.get(int(h1[0]))
    clone = view.clone()
    pool.release(h1)
    assert pool.num_free == 4
    with pytest.raises(ValueError, match="not live"):
        _ = view.token_id  # a borrowed view dies with its lease
    with pytest.raises(ValueError, match="not live"):
        pool.release(h1[:1])  # double release
    assert clone.token_id == 7 and clone.request_id == 0 and clone.num_output_tokens == 1  # clone outlives
    s2, out2, pushed2 = outputs(pool, 4)
    h2 = s2.build_request_outputs(out2, pushed2, pool)
    assert sorted(RequestOutputPool.slot_of(int(h)) for h in h2) == slots1  # same slots reused
    assert not set(h1.tolist()) & set(h2.tolist())  # with a new generation
    assert not pool.is_live(int(h1[0])) and pool.is_live(int(h2[0]))
    pool.release(h2)


def test_release_is_all_or_nothing():
    pool = RequestOutputPool(4)
    s, out, pushed = outputs(pool, 2)
    h = s.build_request_outputs(out, pushed, pool)
    with pytest.raises(ValueError):
        pool.release(np.array([h[0], h[0]], np.uint64))  # repeated inside one batch
    assert pool.num_in_use == 2
    pool.release(h)
    assert pool.num_in_use == 0


def test_gather_columns_match_views():
    pool = RequestOutputPool()
    s, out, pushed = outputs(pool, 3)
    h = s.build_request_outputs(out, pushed, pool, token_logprobs=np.array([-np.inf, np.nan, -0.5], np.float32))
    cols = pool.gather(h)
    assert cols["request_id"].tolist() == [0, 1, 2]
    assert cols["token_logprob"].tolist() == [-9999.0, -9999.0, -0.5]  # clamped, never -inf / NaN
    for j, x in enumerate(h):
        o = pool.get(int(x))
        assert (o.request_id, o.token_id, o.num_output_tokens, o.prompt_len) == (
            cols["request_id"][j], cols["token_id"][j], cols["num_output_tokens"][j], cols["prompt_len"][j])
        assert o.finished == cols["finished"][j] and cols["finished"].dtype == np.bool_
    pool.release(h)
