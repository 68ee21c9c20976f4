"""Issue 9 benchmark: structured-output mask overhead of one decode step at batch 64.

One decode step with nextn = 5 (64 requests x 6 verification rows = 384 logits rows): the sampler
alone (unconstrained) vs mask building (host: matcher walk over the drafts + xgrammar bitmask
fill, draft tokens read to the host) + mask application + the same sampler, every request under
a JSON schema. The model forward is identical either way; `test_report_step_ratio` also times a
real engine decode step at batch 64 so the overhead can be read against a whole step.

    pytest packages/deepinfer-engine/benchmarks/bench_structured_output.py --benchmark-only -q -s
"""

import time

import numpy as np
import pytest
import torch

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.sampler import Sampler, SamplingBatch
from deepinfer_engine.structured_output import StructuredOutput as SO
from deepinfer_engine.structured_output.matcher import RequestGrammar
from deepinfer_sched import StepKind

BATCH, NEXTN = 64, 5
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "tags", "n"]}


class _DecodeStep:  # the SchedulerOutput fields the mask path reads
    step_kind = StepKind.DECODE

    def __init__(self, request_ids):
        self.request_ids = np.asarray(request_ids)
        self.req_cnt = len(request_ids)
        self.seqlens_q = np.full(self.req_cnt, 1 + NEXTN, np.int32)
        self.first_token_pos = (np.arange(self.req_cnt) * (1 + NEXTN)).astype(np.int32)
        self.total_q = self.req_cnt * (1 + NEXTN)
        self.is_last_chunk = np.ones(self.req_cnt, bool)


@pytest.fixture(scope="module")
def setup():
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=512, max_num_seqs=BATCH, max_model_len=512,
              num_speculative_tokens=NEXTN, enable_mtp_varlen=False)
    mgr = llm.engine._structured_output()
    compiled = mgr.compiler.submit(SO.json_schema(SCHEMA)).wait()
    tok = llm.tokenizer
    prefix = tok.encode('{"name": "ab')  # a state inside a string: many tokens allowed (the costly fill)
    drafts = tok.encode('cd", "tags"')[:NEXTN]
    rids = list(range(10_000, 10_000 + BATCH))
    for r in rids:
        g = RequestGrammar(compiled, mgr.max_rollback, [2])
        g.commit(prefix)
        mgr.grammars[r] = g
    step = _DecodeStep(rids)
    input_ids = torch.tensor(([0] + drafts) * BATCH)
    logits = torch.randn(step.total_q, llm.engine.vocab_size)
    batch = SamplingBatch(torch.zeros(BATCH), torch.full((BATCH,), -1, dtype=torch.int32), torch.ones(BATCH),
                          torch.arange(BATCH, dtype=torch.int64), [0] * BATCH)
    ftp = torch.from_numpy(step.first_token_pos)
    seqlens = torch.from_numpy(step.seqlens_q)
    positions = torch.arange(step.total_q, dtype=torch.int64)
    draft_ids = torch.roll(input_ids, -1)
    return llm, mgr, step, input_ids, logits, batch, ftp, seqlens, positions, draft_ids, rids


def _sample(setup, masked: bool):
    llm, mgr, step, input_ids, logits, batch, ftp, seqlens, positions, draft_ids, rids = setup
    masks = None
    if masked:
        masks = mgr.step_masks(step, input_ids)
        for r in rids:  # nothing emitted: roll the walked drafts back (what OutputProcessor.consume's commit does)
            mgr.grammars[r].commit([])
    Sampler().sample(logits.clone(), batch, ftp, seqlens, positions, draft_ids, None, masks=masks)


def test_decode_step_sampler_unconstrained(benchmark, setup):
    benchmark(_sample, setup, False)


def test_decode_step_sampler_json_schema(benchmark, setup):
    benchmark(_sample, setup, True)


def test_report_step_ratio(setup):
    """Median mask overhead vs the sampler and vs a real engine decode step at batch 64 (printed)."""
    def median(fn, n=15):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    from deepinfer_kernels.ops.sampling import apply_vocab_mask_inplace
    _, mgr, step_out, input_ids, logits, *_, rids = setup

    def masks_only():
        vm, ids = mgr.step_masks(step_out, input_ids)
        for r in rids:
            mgr.grammars[r].commit([])
        apply_vocab_mask_inplace(logits.clone(), vm, ids)

    mask_path = median(masks_only, n=30)
    base = median(lambda: _sample(setup, False))
    masked = median(lambda: _sample(setup, True))
    llm = setup[0]
    engine = llm.engine
    rng = np.random.default_rng(0)
    for _ in range(BATCH):
        engine.add_request(prompt_token_ids=rng.integers(7, 8000, size=12).tolist(),
                           params=SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    while engine.stats.num_decode_steps < 3:
        engine.step()
    step = median(engine.step, n=5)
    for r in list(engine.output_processor.requests):
        engine.abort_request(r)
    while engine.has_unfinished():
        engine.step()
    overhead = masked - base
    print(f"\n[structured output, CPU] batch {BATCH}, nextn {NEXTN}: sampler {base * 1e3:.2f} ms, "
          f"sampler+masks {masked * 1e3:.2f} ms (x{masked / base:.2f}); engine decode step {step * 1e3:.1f} ms; "
          f"mask build+apply alone {mask_path * 1e3:.2f} ms = {mask_path / step:.1%} of a step; "
          f"sampler delta / step = {overhead / step:.1%}")
    assert masked > 0 and base > 0
