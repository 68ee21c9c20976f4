"""Runtime estimators and the DP step-type vote (pure functions)."""

import numpy as np
import pytest

from deepinfer_sched import (
    AttemptPoint,
    ForwardRuntimeEstimator,
    SamplerRuntimeEstimator,
    StepKind,
    decide_step_kind,
    prefill_attempt_point,
    step_type_vote,
)


def test_sampler_estimator_is_a_sliding_window_median():
    e = SamplerRuntimeEstimator(window_size=3)
    assert e.estimate_ms() is None
    for x in [1.0, 100.0, 2.0]:
        e.add(x)
    assert e.estimate_ms() == 2.0
    e.add(4.0)  # window [100, 2, 4]
    assert e.estimate_ms() == 4.0
    e.add(6.0)  # [2, 4, 6]
    assert e.estimate_ms() == 4.0
    with pytest.raises(ValueError):
        e.add(float("nan"))


def test_forward_estimator_median_per_size_then_across_sizes():
    e = ForwardRuntimeEstimator(window_size=100, min_samples=3)
    assert e.slope_ms() is None and e.estimate_ms(8, 1.0) == 1.0
    for s in [0.1, 0.1, 0.1, 0.1, 0.1, 9.0]:  # size 8: many samples, one outlier
        e.add(8, 1.0 + s * 8, 1.0)
    for s in [0.3, 0.3, 0.3]:  # size 16
        e.add(16, 2.0 + s * 16, 2.0)
    for s in [0.2, 0.2, 0.2]:  # size 32
        e.add(32, 1.0 + s * 32, 1.0)
    e.add(64, 1.0 + 50.0 * 64, 1.0)  # size 64: too few samples, ignored
    # medians per size: 0.1, 0.3, 0.2 (each size weighs the same) -> 0.2
    assert e.slope_ms() == pytest.approx(0.2)
    assert e.estimate_ms(10, 5.0) == pytest.approx(7.0)


def test_forward_estimator_window_drops_old_samples():
    e = ForwardRuntimeEstimator(window_size=2, min_samples=2)
    e.add(4, 4.0, 0.0)
    e.add(4, 8.0, 0.0)
    e.add(4, 12.0, 0.0)  # window: slopes 2, 3
    assert e.slope_ms() == pytest.approx(2.5)


def test_attempt_points():
    assert prefill_attempt_point(0) == AttemptPoint.ALL
    assert prefill_attempt_point(1) == AttemptPoint.NONE
    assert prefill_attempt_point(70) == AttemptPoint.ALL
    assert prefill_attempt_point(99) == AttemptPoint.NONE
    assert prefill_attempt_point(100) == AttemptPoint.ANY
    assert prefill_attempt_point(140) == AttemptPoint.ANY
    assert prefill_attempt_point(10, all_interval=5, any_interval=20) == AttemptPoint.ALL


def test_env_knobs(monkeypatch):
    monkeypatch.setenv("DEEPINFER_PREFILL_ATTEMPT_INTERVAL", "3")
    monkeypatch.setenv("DEEPINFER_PREFILL_ANY_ATTEMPT_INTERVAL", "5")
    assert [prefill_attempt_point(k) for k in range(7)] == [
        AttemptPoint.ALL, AttemptPoint.NONE, AttemptPoint.NONE, AttemptPoint.ALL, AttemptPoint.NONE,
        AttemptPoint.ANY, AttemptPoint.ANY]


def reduce_min(ranks):
    """The engine's allreduce(MIN), elementwise over each rank's vote."""
    return np.min(np.array([step_type_vote(p, d) for p, d in ranks]), axis=0).tolist()


@pytest.mark.parametrize(
    "ranks,point,kind",
    [
        ([(True, True), (True, True)], AttemptPoint.ALL, StepKind.PREFILL),
        ([(True, True), (False, True)], AttemptPoint.ALL, StepKind.DECODE),  # not everyone has work
        ([(True, True), (False, True)], AttemptPoint.ANY, StepKind.PREFILL),  # someone has work
        ([(True, True), (True, True)], AttemptPoint.NONE, StepKind.DECODE),
        ([(False, True), (False, True)], AttemptPoint.ANY, StepKind.DECODE),
        ([(True, False), (False, False)], AttemptPoint.NONE, StepKind.PREFILL),  # nothing to decode
        ([(False, False), (False, False)], AttemptPoint.ALL, StepKind.IDLE),
    ],
)
def test_vote_decides_one_kind_for_all_ranks(ranks, point, kind):
    assert decide_step_kind(reduce_min(ranks), point) == kind


def test_forced_step_kind_in_the_scheduler():
    from deepinfer_sched import RequestParams, Scheduler, SchedulerConfig

    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=32, max_model_len=32, max_num_batched_tokens=16,
                                  min_final_chunk_tokens=0))
    s.add_request(1, [5, 6], RequestParams(max_tokens=4))
    assert s.schedule(StepKind.DECODE).step_kind == StepKind.IDLE  # nothing decodable yet
    out = s.schedule(StepKind.PREFILL)
    assert out.step_kind == StepKind.PREFILL
    s.process_outputs(out, [9])
    s.add_request(2, [5, 6], RequestParams(max_tokens=4))
    assert s.has_prefill_work() and s.has_decode_work()
    d = s.schedule(StepKind.DECODE)
    assert d.step_kind == StepKind.DECODE and list(d.request_ids) == [1]
