"""The DP front end's parts that need no processes: the vote's decision, the forced schedule, the
rank choice (group_vote.py, load_balance.py)."""

from __future__ import annotations

from deepinfer_engine.parallel.group_vote import GroupState, VotedScheduler
from deepinfer_engine.parallel.load_balance import pick_rank
from deepinfer_engine.parallel.worker import RankLoad
from deepinfer_sched import Scheduler, SchedulerConfig, StepKind, step_type_vote


def _min_vote(*ranks: tuple[bool, bool]) -> list[int]:
    votes = [step_type_vote(p, d) for p, d in ranks]
    return [min(v[i] for v in votes) for i in range(3)]


def test_all_point_prefills_only_when_every_rank_has_prompts():
    one_has = GroupState(_min_vote((True, True), (False, True)), False, 0, 0)
    both = GroupState(_min_vote((True, True), (True, True)), False, 0, 0)
    assert one_has.step_kind(0, 70, 100) == StepKind.DECODE      # ALL point: rank 1 has no prompt
    assert both.step_kind(0, 70, 100) == StepKind.PREFILL
    assert one_has.step_kind(100, 70, 100) == StepKind.PREFILL   # ANY point: a lone rank's prompt waits <= 100
    assert one_has.step_kind(5, 70, 100) == StepKind.DECODE


def test_prefill_at_once_when_no_rank_decodes():
    g = GroupState(_min_vote((True, False), (False, False)), False, 0, 0)
    assert g.step_kind(5, 70, 100) == StepKind.PREFILL


def test_voted_scheduler_forces_the_kind_and_reports_an_idle_rank():
    inner = Scheduler(SchedulerConfig(block_size=16, num_blocks=16, max_num_seqs=4, max_num_batched_tokens=256,
                                      max_model_len=200, nextn=0))
    s = VotedScheduler(inner)
    inner.add_request(0, [5, 6, 7])
    s.force(StepKind.DECODE)                       # the group decodes; this rank has only a prompt
    assert s.has_unfinished()
    assert s.schedule().step_kind == StepKind.IDLE and s.last_kind == StepKind.IDLE
    s.force(StepKind.PREFILL)
    out = s.schedule()
    assert out.step_kind == StepKind.PREFILL and list(out.request_ids) == [0]


def test_a_forced_idle_is_no_work_for_a_rank_without_requests():
    """A group IDLE step leaves a rank without requests idle (counted as work, a ZOS engine put an
    IDLE step in flight on every loop and the rank never went idle); a forced DECODE or PREFILL
    still makes it run the step (its phantom EP rounds)."""
    inner = Scheduler(SchedulerConfig(block_size=16, num_blocks=16, max_num_seqs=4,
                                      max_num_batched_tokens=256, max_model_len=200, nextn=0))
    s = VotedScheduler(inner)
    s.force(StepKind.IDLE)
    assert not s.has_unfinished()
    for kind in (StepKind.DECODE, StepKind.PREFILL):
        s.force(kind)
        assert s.has_unfinished()


def test_pick_rank_by_queue_depth_then_kv_use_then_id():
    loads = [RankLoad(0, 0, 0.9), RankLoad(1, 0, 0.0), RankLoad(2, 0, 0.0)]
    assert pick_rank(loads, [1, 1, 1]) == 1        # equal queues: the emptier KV pool
    assert pick_rank(loads, [0, 4, 4]) == 0        # 0 + 4 x 0.9 < 4: the shorter queue
    assert pick_rank(loads, [0, 3, 3]) == 1        # 3.6 > 3: a nearly full KV pool counts
    assert pick_rank([RankLoad(r, 0, 0.0) for r in range(2)], [2, 2]) == 0
