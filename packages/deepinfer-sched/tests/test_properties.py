"""Hypothesis property tests over random request streams.

Every step (LedgerHarness) checks the four ledger checkpoints of seed 000 — row layout, accepted
prefix contiguous with -1 terminator, pushed <= accepted + 1 and strictly less only on a stop
(against a stop-rule oracle), used MTP slots == running — plus emitted tokens == appended tokens,
block reference counts == holders, no block leak, the ZOS position correction, and the state kind:
used state slots == running, each held by one running sequence (none by a waiting or preempted
one), in 1..max_num_seqs; at the end every request finished exactly once and all blocks and both
kinds of slots returned (streams abort and preempt: small pools).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_sched import RequestParams, Scheduler, SchedulerConfig
from deepinfer_sched.testing import LedgerHarness, SimulatedDevice

VOCAB = 16
EOS = 2
PREFIXES = [list(range(3, 3 + 12)), [7] * 12, list(range(15, 3, -1))]


@st.composite
def configs(draw):
    nextn = draw(st.sampled_from([0, 1, 3]))
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.integers(16, 40))
    min_blocks = -(-(max_model_len + 2 * (nextn + 1)) // block_size)
    budget = draw(st.integers(4, 32))
    return SchedulerConfig(
        block_size=block_size,
        num_blocks=min_blocks + draw(st.integers(0, 24)),  # small pools force preemption
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        nextn=nextn,
        min_final_chunk_tokens=draw(st.integers(0, min(budget, 8))),
        enable_prefix_caching=draw(st.booleans()),
        eos_token_ids=[EOS],
        swa_snapshot_tokens=block_size * draw(st.sampled_from([0, 1, 2, 4])),   # the SWA tier (0 = off)
    )


@st.composite
def requests(draw):
    prefix = draw(st.sampled_from(PREFIXES))
    shared = draw(st.integers(0, len(prefix)))
    tail = draw(st.lists(st.integers(0, VOCAB - 1), max_size=20))
    prompt = (prefix[:shared] + tail) or [5]
    max_tokens = draw(st.integers(1, 24))
    return dict(
        arrival=draw(st.integers(0, 12)),
        prompt=prompt,
        params=RequestParams(
            max_tokens=max_tokens,
            min_tokens=draw(st.integers(0, min(3, max_tokens))),
            stop_token_ids=draw(st.lists(st.integers(3, VOCAB - 1), max_size=2)),
            ignore_eos=draw(st.booleans()),
        ),
        abort_at=draw(st.one_of(st.none(), st.integers(0, 30))),
    )


def run_stream(cfg, reqs, seed, zos, accept_prob, varlen):
    sched = Scheduler(cfg)
    dev = SimulatedDevice(seed, vocab_size=VOCAB, accept_prob=accept_prob)
    h = LedgerHarness(sched, dev, zos=zos)
    rng = np.random.default_rng(seed)
    step = 0
    pending = sorted(enumerate(reqs), key=lambda x: x[1]["arrival"])
    while pending or h.step():
        while pending and pending[0][1]["arrival"] <= step:
            rid, r = pending.pop(0)
            h.add(rid, r["prompt"], r["params"])
        for rid, r in enumerate(reqs):
            if r["abort_at"] == step and rid in h.requests:
                h.abort(rid)
        if varlen and cfg.nextn > 0 and h.requests:
            ids = list(h.requests)
            sched.set_num_drafts(ids, rng.integers(0, cfg.nextn + 1, size=len(ids)))
        if pending:
            h.step()
        step += 1
        assert step < 5000, "stream did not drain"
    h.check_drained()
    return h


def streams(max_requests: int):
    """`given` over run_stream's inputs: a config, 1..max_requests requests, seed, ZOS, acceptance."""
    return given(
        cfg=configs(),
        reqs=st.lists(requests(), min_size=1, max_size=max_requests),
        seed=st.integers(0, 2**31),
        zos=st.booleans(),
        accept_prob=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
        varlen=st.booleans(),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@streams(max_requests=8)
def test_random_streams_keep_the_ledger(cfg, reqs, seed, zos, accept_prob, varlen):
    run_stream(cfg, reqs, seed, zos, accept_prob, varlen)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@streams(max_requests=12)
def test_random_streams_keep_the_ledger_long(cfg, reqs, seed, zos, accept_prob, varlen):
    run_stream(cfg, reqs, seed, zos, accept_prob, varlen)
