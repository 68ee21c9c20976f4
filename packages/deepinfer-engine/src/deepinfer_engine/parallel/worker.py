"""One DP rank: its own LLMEngine (scheduler, KV cache, attention over its own requests), the
model's routed experts partitioned over the group (expert_parallel.py), stepping in lockstep.

Loop of a rank (every rank runs the same sequence of collectives):

    1. drain commands (blocking only while the whole group is idle)
    2. vote (group_vote.py): idle everywhere -> catch up on commands or wait; else the step kind
    3. engine.step() with that kind forced (a rank without work schedules IDLE: no forward)
    4. ep.finish_step(): phantom MoE rounds until every rank is done (the dummy step)
    5. EPLB (eplb_runtime.py): record routing, every interval rebalance (weights move rank to rank)
    6. finished outputs (global request ids), the rank's load and, while the front end streams,
       the step's StreamDeltas go to the front end

Any exception (a failed or timed-out collective included) is reported to the front end with the
rank's id, then the process exits: the front end ends the engine with an error naming the rank.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pickle
import queue
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from deepinfer_engine.config import EngineConfig
from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.parallel.eplb_runtime import EplbRuntime
from deepinfer_engine.parallel.group_vote import VotedScheduler, kv_used_fraction, vote
from deepinfer_engine.parallel.rank_profile import rank_profile
from deepinfer_engine.request_state import FINISH_REASON_ERROR
from deepinfer_engine.stats import EngineGauges
from deepinfer_sched import StepKind

COLLECTIVE_TIMEOUT_ENV = "DEEPINFER_DP_TIMEOUT_S"   # a collective waiting longer fails the engine (default 300)
STATIC_DECODE_ENV = "DEEPINFER_EP_STATIC_DECODE"     # 1 (default): decode steps use static EP rounds (ep_comm.py)


@dataclass
class RankSpec:
    """What the front end hands each rank process."""

    rank: int
    world: int
    init_method: str                 # tcp://host:port of the process group's store
    engine_args: dict                # EngineConfig fields
    expert_parallel: bool
    backend: str                     # "gloo" (CPU) | "nccl" (one GPU per rank)
    timeout_s: float = 300.0
    parent_pid: int = field(default_factory=os.getpid)   # the front end: a rank whose parent is gone exits


@dataclass
class RankLoad:
    rank: int
    num_requests: int                # waiting + running
    kv_used: float                   # fraction of KV blocks in use
    moe_lb: float | None = None      # EPLB's figure (expert parallel only), slowest / mean rank
    gauges: EngineGauges | None = None   # what the server's metrics read (sent while streaming)


@dataclass
class RankState:
    consumed: int = 0                # commands consumed (every command reaches every rank)
    shutdown: bool = False
    global_ids: dict[int, int] = field(default_factory=dict)   # engine request id -> front-end id
    decode_steps: int = 0            # decode steps since the last prefill step (same on every rank)
    parent_pid: int = 0
    streaming: bool = False          # the front end wants each step's StreamDeltas


def rank_main(spec: RankSpec, inbox, outbox) -> None:
    try:
        _run(spec, inbox, outbox)
    except BaseException as err:   # noqa: BLE001  (reported with the rank id, then the process ends)
        outbox.put(("error", spec.rank, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(spec: RankSpec, inbox, outbox) -> None:
    from deepinfer_engine.llm_engine import LLMEngine
    from deepinfer_model.parallel.expert_parallel import apply_expert_parallel

    torch.set_num_threads(max(1, int(os.environ.get("DEEPINFER_DP_THREADS", "1"))))
    args = dict(spec.engine_args)
    static = spec.expert_parallel and os.environ.get(STATIC_DECODE_ENV, "1") != "0"
    graphs = args.get("cuda_graphs", True)
    if spec.backend == "nccl":
        torch.cuda.set_device(spec.rank)
        args["device"] = f"cuda:{spec.rank}"
    if spec.expert_parallel:
        args["cuda_graphs"] = False   # captured below, after the transform (static decode rounds only)
    dist.init_process_group(spec.backend, init_method=spec.init_method, rank=spec.rank, world_size=spec.world,
                            timeout=datetime.timedelta(seconds=spec.timeout_s))
    engine = LLMEngine(EngineConfig(**args))
    eplb = None
    if spec.expert_parallel:
        eplb = EplbRuntime.from_environ(engine.model, spec.world)
        eplb.attach(apply_expert_parallel(engine.model, num_extra=eplb.num_extra))
        max_rows = min(engine.max_num_batched_tokens, engine.config.max_num_seqs * (engine.nextn + 1))
        if static:
            eplb.ep.comm.static_capacity = max_rows   # the largest decode step of any rank
        if static and graphs and engine.device.type == "cuda":
            eplb.ep.begin_step(static=True)          # every rank captures the same buckets in order
            engine.runner.enable_cuda_graphs(max_rows, engine.max_model_len,
                                             engine.envs.cudagraph_batch_size_interval, compile=False)
            eplb.ep.begin_step(static=False)
    sched = VotedScheduler(engine.scheduler)
    engine.scheduler = sched
    outbox.put(("ready", spec.rank, {"vocab_size": engine.vocab_size, "model_source": engine.model_source,
                                     "max_model_len": engine.max_model_len,
                                     "tokenizer": engine.tokenizer if spec.rank == 0 else None}))
    with rank_profile(spec.rank):
        _loop(spec, engine, sched, eplb, inbox, outbox)


def _loop(spec: RankSpec, engine, sched: VotedScheduler, eplb: EplbRuntime | None, inbox, outbox) -> None:
    st = RankState(parent_pid=spec.parent_pid)
    all_interval, any_interval = engine.envs.prefill_attempt_interval, engine.envs.prefill_any_attempt_interval
    while True:
        if os.getppid() != st.parent_pid:   # the front end died (killed): do not run on as an orphan
            raise SystemExit(0)
        _drain(engine, st, inbox, outbox, spec.rank, block=False)
        idle = not engine.has_unfinished()
        g = vote(sched.has_prefill_work(), sched.has_decode_work(), idle, st.consumed)
        if g.all_idle:
            if g.min_consumed < g.max_consumed:
                # a rank is behind: it catches up (its commands are on the way), then every rank
                # votes again. A rank that is not behind must not wait for a next command here: the
                # one behind may just have received a request and then waits in the next vote.
                while st.consumed < g.max_consumed:
                    _drain(engine, st, inbox, outbox, spec.rank, block=True)
                continue
            if st.shutdown:
                return
            _drain(engine, st, inbox, outbox, spec.rank, block=True)
            continue
        kind = g.step_kind(st.decode_steps, all_interval, any_interval)
        sched.force(kind)
        if eplb is not None:
            eplb.ep.begin_step(static=eplb.ep.comm.static_capacity is not None and kind == StepKind.DECODE)
        finished = engine.step()
        if eplb is not None:
            eplb.after_step(ran_forward=sched.last_kind == kind)
        st.decode_steps = st.decode_steps + 1 if kind == StepKind.DECODE else (
            0 if kind == StepKind.PREFILL else st.decode_steps)
        deltas = engine.pop_stream_deltas() if st.streaming else []
        for d in deltas:   # (d.output is the live output: the front end renames its copy)
            d.request_id = st.global_ids[d.request_id]
        for out in finished:
            out.request_id = st.global_ids.pop(out.request_id)
        if finished or deltas:
            load = RankLoad(spec.rank, sched.num_waiting() + sched.num_running(), kv_used_fraction(sched),
                            None if eplb is None else eplb.last_moe_lb,
                            _gauges_copy(engine) if st.streaming else None)
            # pickled now: the live outputs in the deltas change in the next step (the queue's feeder
            # thread pickles later)
            outbox.put(("outputs", spec.rank, finished, load, pickle.dumps(deltas) if deltas else None))


def _gauges_copy(engine) -> EngineGauges:
    """The engine's gauges with its counters copied: the queue pickles them later, off this thread."""
    g = engine.gauges()
    g.stats = dataclasses.replace(g.stats)
    return g


def _drain(engine, st: RankState, inbox, outbox, rank: int, block: bool) -> None:
    """Handle the queued commands (at least one when `block`)."""
    while True:
        try:
            cmd = inbox.get(timeout=1.0) if block else inbox.get_nowait()
        except queue.Empty:
            if block:
                if os.getppid() != st.parent_pid:   # the front end died: do not linger as an orphan
                    raise SystemExit(0) from None
                continue
            return
        block = False
        st.consumed += 1
        op, payload = cmd
        if op == "add":
            rejected = []
            for gid, prompt, ids, params in payload.get(rank, ()):
                try:
                    st.global_ids[engine.add_request(prompt, ids, params)] = gid
                except InvalidRequestError as err:
                    rejected.append(GenerationOutput(request_id=gid, prompt=prompt, prompt_token_ids=ids or [],
                                                     finish_reason=FINISH_REASON_ERROR, error=str(err)))
            if rejected:
                deltas = [StreamDelta(-1, out.request_id, "", [], True, out) for out in rejected] if st.streaming else []
                outbox.put(("outputs", rank, rejected, None, pickle.dumps(deltas) if deltas else None))
        elif op == "abort":
            local = {g: r for r, g in st.global_ids.items()}
            for gid in payload:
                if gid in local:
                    engine.abort_request(local[gid])
        elif op == "stream":
            st.streaming = payload
            engine.start_streaming() if payload else engine.stop_streaming()
            if payload:   # the front end's gauges start from this rank's idle state
                sched = engine.scheduler
                load = RankLoad(rank, sched.num_waiting() + sched.num_running(), kv_used_fraction(sched),
                                gauges=_gauges_copy(engine))
                outbox.put(("outputs", rank, [], load, None))
        elif op == "stop":
            st.shutdown = True
