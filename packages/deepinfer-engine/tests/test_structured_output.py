"""Issue 9: structured output (xgrammar) composes with speculation.

The tiny random model emits arbitrary tokens, so validity comes from the masks alone. Every
schema is bounded (maxLength, enums, integer ranges, maxItems) so a random model finishes it.
"""

import json
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.structured_output import StructuredOutput as SO
from deepinfer_engine.structured_output.compiler import ByteLRU, GrammarCompilerService, _Compiled
from deepinfer_engine.structured_output.matcher import RequestGrammar

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make the sibling data module importable
from structured_cases import EBNF_GRAMMARS, JSON_SCHEMAS, REGEXES, check_ebnf  # noqa: E402

jsonschema = pytest.importorskip("jsonschema")  # a test extra (installed by make test); absent on the GPU box

SPECS = [SO.json_schema(s) for s in JSON_SCHEMAS] + [SO.regex(r) for r in REGEXES] + [SO.grammar(g) for g in EBNF_GRAMMARS]
MAX_TOKENS = 120


def _llm(nextn: int, **kw) -> LLM:
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=256, max_num_seqs=64, max_model_len=512,
               num_speculative_tokens=nextn, enable_mtp_varlen=False, **kw)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(7, 8000, size=int(rng.integers(3, 30))).tolist() for _ in range(n)]


def _check(i: int, text: str) -> None:
    if i < len(JSON_SCHEMAS):
        jsonschema.validate(json.loads(text), JSON_SCHEMAS[i])  # strict json: no raw control characters
    elif i < len(JSON_SCHEMAS) + len(REGEXES):
        assert re.fullmatch(REGEXES[i - len(JSON_SCHEMAS)], text), (REGEXES[i - len(JSON_SCHEMAS)], text)
    else:
        k = i - len(JSON_SCHEMAS) - len(REGEXES)
        assert check_ebnf(k, text), (EBNF_GRAMMARS[k], text)


def _generate(llm: LLM, temperature: float, specs=SPECS, prompts=None):
    prompts = prompts or _prompts(len(specs))
    params = [SamplingParams(temperature=temperature, seed=5, max_tokens=MAX_TOKENS, structured_output=s) for s in specs]
    return prompts, llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)


def _assert_all_valid(outs) -> None:
    eos = 2
    for i, o in enumerate(outs):
        assert o.error is None and o.finish_reason == "stop", (i, o.finish_reason, o.error, o.text)
        assert o.token_ids[-1] == eos and o.stop_token_id == eos  # EOS only once the grammar accepts
        _check(i, o.text)


@pytest.fixture(scope="module")
def greedy_no_spec():
    prompts, outs = _generate(_llm(0), 0.0)
    return prompts, outs


def test_cases_cover_the_issue():
    assert len(JSON_SCHEMAS) == 30
    text = json.dumps(JSON_SCHEMAS)
    for feature in ('"$ref"', '"$defs"', '"anyOf"', '"pattern"', '"minimum"', '"maximum"', '"maxItems"', '"enum"'):
        assert feature in text


def test_all_outputs_valid_without_speculation(greedy_no_spec):
    _assert_all_valid(greedy_no_spec[1])


@pytest.mark.parametrize("nextn, temperature", [(0, 0.8), (5, 0.0), (5, 0.8)])
def test_all_outputs_valid(nextn, temperature):
    _, outs = _generate(_llm(nextn), temperature)
    _assert_all_valid(outs)
    if nextn:
        assert sum(o.num_draft_tokens for o in outs) > 0


def test_greedy_with_oracle_drafts_is_exact_and_drafts_roll_back(greedy_no_spec, make_oracle):
    """Drafts from the true constrained continuation, every third one corrupted: accepted blocks,
    grammar-rejected drafts (rollback) and rejections by the target all happen; greedy output is
    token-identical to no speculation and valid."""
    prompts, expected = greedy_no_spec
    oracle = make_oracle([p + o.token_ids for p, o in zip(prompts, expected)], 5, corrupt_every=3)
    llm = _llm(5)
    _, outs = _generate(llm, 0.0, prompts=prompts)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    _assert_all_valid(outs)
    st = llm.engine.stats
    assert oracle.num_hits > 0 and st.num_accepted_tokens > 0 and 0 < st.acceptance_rate < 1
    assert max(o.num_accepted_tokens for o in outs) >= 3  # whole draft blocks accepted under the grammar


def test_oracle_drafts_with_sampling_stay_valid(make_oracle):
    prompts, ref = _generate(_llm(0), 0.0)
    make_oracle([p + o.token_ids for p, o in zip(prompts, ref)], 5, corrupt_every=4)
    _, outs = _generate(_llm(5), 0.7, prompts=prompts)
    _assert_all_valid(outs)


def test_json_object_and_whitespace_bounded():
    specs = [SO.json_object(), SO.json_object(any_whitespace=True, max_whitespace_cnt=2)]
    _, outs = _generate(_llm(0), 0.0, specs=specs)
    for o in outs:
        if o.finish_reason == "stop":  # an unbounded object may hit max_tokens; what exists must be JSON-shaped
            assert isinstance(json.loads(o.text), dict)
        assert o.text.startswith("{")
        assert "   " not in re.sub(r'"(?:[^"\\]|\\.)*"', '""', o.text)  # no whitespace run > 2 outside strings


def test_invalid_grammars_fail_alone():
    llm = _llm(5)
    good = [SO.json_schema(JSON_SCHEMAS[1]), SO.regex(REGEXES[0])]
    bad = [SO.json_schema({"type": "objec"}), SO.regex("[a-"), SO.grammar("root ::= foo")]
    prompts = _prompts(5, seed=3)
    specs = [good[0], bad[0], bad[1], good[1], bad[2]]
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_output=s) for s in specs]
    params.append(SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))  # unconstrained neighbour
    outs = llm.generate(prompt_token_ids=prompts + [[5, 6, 7]], sampling_params=params, use_tqdm=False)
    for i in (1, 2, 4):
        assert outs[i].finish_reason == "error" and outs[i].error.startswith("structured_output: invalid ")
        assert outs[i].token_ids == []
    assert "objec" in outs[1].error and "Unclosed" in outs[2].error and "foo" in outs[4].error
    alone = _llm(5).generate(prompt_token_ids=[prompts[0], prompts[3], [5, 6, 7]], sampling_params=[
        params[0], params[3], params[5]], use_tqdm=False)
    assert [outs[i].token_ids for i in (0, 3, 5)] == [o.token_ids for o in alone]
    _check(1, outs[0].text)
    _check(30, outs[3].text)
    # a malformed spec is rejected synchronously, naming the field
    with pytest.raises(Exception) as err:
        SamplingParams(structured_output={"json_schema": "{not json"})
    assert err.value.field == "structured_output"
    with pytest.raises(Exception) as err:
        SamplingParams(structured_output={"xml": "<a/>"})
    assert err.value.field == "structured_output"


def test_compile_timeout_fails_alone_and_never_blocks_others():
    llm = _llm(0, structured_output_compile_timeout_s=1e-7)
    outs = llm.generate(prompt_token_ids=[[5, 6, 7], [8, 9]], sampling_params=[
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_output=SO.json_schema(JSON_SCHEMAS[15])),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)], use_tqdm=False)
    assert outs[0].finish_reason == "error" and "timed out" in outs[0].error and outs[0].error.startswith("structured_output")
    assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 5


def test_slow_compile_does_not_stall_the_loop(monkeypatch):
    """A compilation held back until the unconstrained request has finished: that request runs to
    completion while the compile is still pending (ordering, not wall time), then the grammar
    request is admitted and finishes valid."""
    original = GrammarCompilerService._compile_now
    release = threading.Event()
    released_by_test: list[bool] = []

    def held(self, spec):
        released_by_test.append(release.wait(timeout=60))  # False: the loop never let the other one finish
        return original(self, spec)

    monkeypatch.setattr(GrammarCompilerService, "_compile_now", held)
    llm = _llm(0)
    engine = llm.engine
    gid = engine.add_request(prompt_token_ids=[5, 6, 7], params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, structured_output=SO.regex(REGEXES[2])))
    fid = engine.add_request(prompt_token_ids=[8, 9], params=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    order: list[int] = []
    while engine.has_unfinished():
        for o in engine.step():
            order.append(o.request_id)
            if o.request_id == fid:
                release.set()
            if o.request_id == gid:
                _check(32, o.text)
    assert order == [fid, gid] and released_by_test == [True]


def test_compile_cache_shares_and_bounds_bytes():
    llm = _llm(0)
    p = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_output=SO.json_schema(JSON_SCHEMAS[3]))
    same = SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                          structured_output=SO.json_schema(json.dumps(JSON_SCHEMAS[3])))  # str form, same key
    llm.generate(prompt_token_ids=[[5, 6, 7], [9, 10]], sampling_params=[p, same], use_tqdm=False)
    cache = llm.engine.structured_output.compiler.cache
    assert len(cache) == 1 and cache.nbytes > 0
    lru = ByteLRU(100)
    for k in range(5):
        lru.put(k, _Compiled(None, 0.0, 40))
        assert lru.nbytes <= 100
    assert lru.get(0) is None and lru.get(4) is not None and lru.evictions == 3
    lru.put("huge", _Compiled(None, 0.0, 1000))  # larger than the cache: not kept
    assert lru.get("huge") is None


@pytest.fixture(scope="module")
def manager():
    llm = _llm(0)
    return llm, llm.engine._structured_output()


def _bits(bitmask: torch.Tensor, row: int) -> set[int]:
    words = bitmask[row].tolist()
    return {w * 32 + b for w, v in enumerate(words) for b in range(32) if (v >> b) & 1}


def test_matcher_walks_drafts_and_rolls_back(manager):
    llm, mgr = manager
    compiled = mgr.compiler.submit(SO.regex(r"(ab|cd){1,4}")).wait()
    tok = llm.tokenizer
    a, b, c, d = (tok.token_to_id(x) for x in "abcd")
    g = RequestGrammar(compiled, max_rollback=mgr.max_rollback, eos_token_ids=[2])
    fresh = RequestGrammar(compiled, max_rollback=mgr.max_rollback, eos_token_ids=[2])
    bm = torch.zeros((4, mgr.width), dtype=torch.int32)
    g.fill_rows(bm, 0, [a, b, a])           # rows: S, S+a, S+ab, S+aba
    def allows(row, yes, no, m=bm):
        bits = _bits(m, row)
        return all(t in bits for t in yes) and not any(t in bits for t in no)

    assert allows(0, [a, c], [b, d, 2])
    assert allows(1, [b], [a, c, d, 2])
    assert allows(2, [2, a, c], [b, d])       # "ab" is complete: EOS allowed, or continue
    assert allows(3, [b], [a, c, 2])
    g.commit([a, b, c])                     # drafts a, b accepted, third rejected; main token c
    fresh.commit([a, b, c])
    bm2 = torch.zeros((2, mgr.width), dtype=torch.int32)
    g.fill_rows(bm2, 0, [])
    fresh.fill_rows(bm2, 1, [])
    assert torch.equal(bm2[0], bm2[1]) and allows(0, [d], [a, b, c, 2], m=bm2)
    # a grammar-rejected draft stops the walk; the rows after it repeat its mask
    bm3 = torch.zeros((3, mgr.width), dtype=torch.int32)
    g.fill_rows(bm3, 0, [a, a])
    assert torch.equal(bm3[0], bm2[0]) and torch.equal(bm3[1], bm3[0]) and torch.equal(bm3[2], bm3[0])
    g.commit([d])
    with pytest.raises(Exception, match="not accepted"):
        g.commit([a, a])


def test_batched_walk_equals_one_request_at_a_time(manager):
    """fill_rows_batch (one batched xgrammar fill per draft position) gives every request the rows
    its own fill_rows gives: accepted, grammar-rejected and past-the-end drafts, a terminated grammar."""
    from deepinfer_engine.structured_output.matcher import fill_rows_batch

    llm, mgr = manager
    compiled = mgr.compiler.submit(SO.regex(r"(ab|cd){1,4}")).wait()
    a, b, c, d = (llm.tokenizer.token_to_id(x) for x in "abcd")
    histories = [[], [a], [a, b], [c, d, a, b, c, d, 2], [c]]       # the 4th has completed (EOS accepted)
    drafts = [[a, b, c, d, a], [b], [c, c, a], [], [d, a, b]]

    def fresh():
        out = []
        for h in histories:
            g = RequestGrammar(compiled, max_rollback=mgr.max_rollback, eos_token_ids=[2])
            g.commit(h)
            out.append(g)
        return out

    rows = [len(ds) + 1 for ds in drafts]
    first = list(np.cumsum([0] + rows[:-1]))
    one_by_one = torch.zeros((sum(rows), mgr.width), dtype=torch.int32)
    singles = fresh()
    for g, f, ds in zip(singles, first, drafts, strict=True):
        g.fill_rows(one_by_one, int(f), ds)
    batched = torch.zeros_like(one_by_one)
    together = fresh()
    assert together[3].is_terminated
    fill_rows_batch(together, batched, [int(f) for f in first], drafts)
    assert torch.equal(batched, one_by_one)
    assert [g.pending for g in together] == [g.pending for g in singles] == [[a, b, c, d, a], [b], [c], [], [d, a, b]]


def test_step_masks_rows_follow_drafts(manager):
    """step_masks on a decode-shaped step: row k of a grammar request = state after drafts 0..k-1,
    the unconstrained request's rows untouched."""
    from deepinfer_kernels.ops.sampling import NO_VOCAB_MASK
    from deepinfer_sched import StepKind
    llm, mgr = manager
    tok = llm.tokenizer
    a, b = tok.token_to_id("a"), tok.token_to_id("b")
    mgr.grammars[1000] = RequestGrammar(mgr.compiler.submit(SO.regex("(ab)+")).wait(), mgr.max_rollback, [2])

    class Out:  # the SchedulerOutput fields step_masks reads
        step_kind = StepKind.DECODE
        request_ids = np.array([7, 1000])
        req_cnt = 2
        first_token_pos = np.array([0, 2], np.int32)
        seqlens_q = np.array([2, 3], np.int32)
        total_q = 5
        is_last_chunk = np.array([True, True])

    input_ids = torch.tensor([11, 12, 99, a, b])  # request 1000: golden 99, drafts a, b
    vocab_mask, row_ids = mgr.step_masks(Out(), input_ids)
    try:
        assert row_ids.tolist() == [NO_VOCAB_MASK, NO_VOCAB_MASK, 0, 1, 2]
        bits = [_bits(vocab_mask.cpu(), r) for r in range(3)]
        assert a in bits[0] and b not in bits[0] and 2 not in bits[0]
        assert b in bits[1] and a not in bits[1] and 2 not in bits[1]
        assert a in bits[2] and 2 in bits[2] and b not in bits[2]
    finally:
        mgr.commit(1000, [])
        mgr.drop(1000)


def test_grammar_completion_finishes_even_with_ignore_eos():
    llm = _llm(5)
    out = llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, structured_output=SO.regex("(yes|no)")), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no") and out.token_ids[-1] == 2
    assert not llm.engine.has_unfinished() and llm.engine.scheduler.num_running() == 0


@pytest.mark.parametrize("zos", [True, False])
@pytest.mark.parametrize("nextn", [0, 5])
def test_grammar_steps_take_the_split_graph_path(count_graph_runner_calls, nextn, zos):
    """With the decode graph runner on (emulated on the CPU), steps holding a grammar request run
    the forward graph, then (after the previous step's ledger, with ZOS) the masks and the tail
    graph; steps without one the whole-step graph. A batch mixing constrained and free requests
    gives the same outputs as without the runner."""
    specs = [SPECS[0], None, SPECS[len(JSON_SCHEMAS)], None]
    prompts = _prompts(len(specs), seed=3)
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS if s else 24, ignore_eos=s is None,
                             structured_output=s) for s in specs]
    want = _llm(nextn, zero_overhead_scheduling=zos).generate(prompt_token_ids=prompts, sampling_params=params,
                                                               use_tqdm=False)
    llm = _llm(nextn, zero_overhead_scheduling=zos)
    llm.engine.runner.enable_cuda_graphs(64 * 6, llm.engine.max_model_len, interval=8)
    calls = count_graph_runner_calls("run", "run_step", "run_tail")
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert calls["run"] == calls["run_tail"] > 0 and calls["run_step"] > 0   # masked steps split, free ones whole
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    _check(0, got[0].text)
    _check(len(JSON_SCHEMAS), got[2].text)
