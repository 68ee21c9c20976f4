"""Presence / frequency / repetition penalties: the batched device op against the per-token torch
reference (with speculative verification rows), the on-device counts, and the engine end to end
(greedy speculation == greedy without it, penalties on)."""

from __future__ import annotations

import pytest
import torch

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.penalties import PenaltyTable, apply_penalties, apply_penalties_ref, record_emitted

VOCAB = 50


def _table(histories, prompts, params):
    table = PenaltyTable(VOCAB, torch.device("cpu"), num_slots=2)   # grows past 2
    for rid, (prompt, hist) in enumerate(zip(prompts, histories)):
        slot = table.assign(rid, prompt)
        for t in hist:
            table.counts[slot, t] += 1
    return table, table.batch(list(range(len(prompts))), params)


@pytest.mark.parametrize("case", ["presence", "frequency", "repetition", "all"])
def test_apply_penalties_matches_reference_with_draft_rows(case):
    g = torch.Generator().manual_seed(0)
    p = {"presence": (1.5, 0.0, 1.0), "frequency": (0.0, 0.7, 1.0), "repetition": (0.0, 0.0, 1.8),
         "all": (-0.5, 1.2, 0.6)}[case]
    params = [SamplingParams(presence_penalty=p[0], frequency_penalty=p[1], repetition_penalty=p[2]),
              None,   # a finished request (placeholder): no penalties
              SamplingParams(presence_penalty=p[0] / 2, frequency_penalty=p[1] / 2, repetition_penalty=1.0),
              SamplingParams(presence_penalty=p[0], frequency_penalty=p[1], repetition_penalty=p[2])]
    prompts = [[1, 2, 3], [4], [5, 5, 6], [7, 8, 9, 10]]
    histories = [[3, 3, 11, 12], [], [13], [7, 14, 14, 14]]
    table, pen = _table(histories, prompts, params)
    seqlens = torch.tensor([3, 1, 2, 4], dtype=torch.int32)
    ftp = torch.cumsum(seqlens, 0, dtype=torch.int32) - seqlens
    rows = int(seqlens.sum())
    row_req = torch.repeat_interleave(torch.arange(4), seqlens.long())
    drafts = torch.randint(0, VOCAB, (rows,), generator=g)
    drafts[0] = 3   # a draft repeating a history token
    logits = torch.randn(rows, VOCAB, generator=g) * 3
    got = apply_penalties(logits, pen, row_req, ftp, drafts)
    for i in range(4):
        for j in range(int(seqlens[i])):
            r = int(ftp[i]) + j
            prev_drafts = drafts[int(ftp[i]): r].tolist()   # drafts verified at the block's earlier rows
            q = params[i] or SamplingParams()
            want = apply_penalties_ref(logits[r], histories[i] + prev_drafts, prompts[i] if params[i] else [],
                                       q.presence_penalty, q.frequency_penalty, q.repetition_penalty)
            torch.testing.assert_close(got[r], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[int(ftp[1])], logits[int(ftp[1])])   # no penalties: bit-identical


def test_record_emitted_counts_accepted_drafts_and_main_token():
    params = [SamplingParams(frequency_penalty=1.0), SamplingParams(presence_penalty=1.0), None]
    table, pen = _table([[], [], []], [[1], [2], [3]], params)
    seqlens = torch.tensor([3, 2, 1], dtype=torch.int32)
    ftp = torch.tensor([0, 3, 5], dtype=torch.int32)
    row_req = torch.repeat_interleave(torch.arange(3), seqlens.long())
    verified = torch.tensor([10, 11, -1, -1, -1, -1], dtype=torch.int32)   # request 0 accepted 2 drafts
    record_emitted(pen, row_req, ftp, verified, torch.tensor([2, 0, 0], dtype=torch.int32),
                   torch.tensor([12, 20, 30], dtype=torch.int32))
    s0, s1 = table.slot_of[0], table.slot_of[1]
    assert {t: int(c) for t, c in enumerate(table.counts[s0].tolist()) if c} == {10: 1, 11: 1, 12: 1}
    assert {t: int(c) for t, c in enumerate(table.counts[s1].tolist()) if c} == {20: 1}
    assert int(table.counts[0].sum()) == 0   # the padding slot records nothing
    table.release(0)
    assert table.assign(7, [4]) == s0 and int(table.counts[s0].sum()) == 0   # a reused slot starts clean


PROMPTS = ["def add(a, b):", "class Stack:\n    def push(self, x):", "import os\n\ndef walk(path):"]
PENALTIES = [dict(frequency_penalty=1.5), dict(presence_penalty=2.0), dict(repetition_penalty=1.8),
             dict(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.3)]


def _greedy(llm: LLM, pen: dict, n: int = 24):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **pen) for _ in PROMPTS]
    return [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def spec_and_plain():
    kw = dict(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
              enable_mtp_varlen=False)
    return LLM(num_speculative_tokens=3, **kw), LLM(num_speculative_tokens=0, **kw)


@pytest.mark.parametrize("pen", PENALTIES, ids=lambda p: "+".join(p))
def test_greedy_speculation_equals_plain_decoding_with_penalties(spec_and_plain, pen):
    spec, plain = spec_and_plain
    want = _greedy(plain, pen)
    assert _greedy(spec, pen) == want
    assert spec.engine.stats.num_accepted_tokens > 0   # verification rows really were used
    assert want != _greedy(plain, {})                  # the penalty changed the output


def test_frequency_penalty_reduces_repetition(spec_and_plain):
    _, plain = spec_and_plain
    base, pen = _greedy(plain, {}, 48), _greedy(plain, dict(frequency_penalty=2.0), 48)
    repeats = lambda seqs: sum(len(s) - len(set(s)) for s in seqs)  # noqa: E731
    assert repeats(pen) < repeats(base)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_penalties_on_cuda_with_graphs_match_spec_and_plain():
    """On the GPU: penalised steps leave the whole-step graph for the eager sampler; greedy
    speculation still equals plain greedy decoding with every penalty, and a penalty-free batch
    beside them keeps its graphed tokens."""
    kw = dict(device="cuda", dtype="float32", max_num_seqs=8, max_model_len=256, enable_mtp_varlen=False)
    spec, plain = LLM(num_speculative_tokens=3, **kw), LLM(num_speculative_tokens=0, **kw)
    for pen in PENALTIES:
        assert _greedy(spec, pen) == _greedy(plain, pen)
    assert _greedy(spec, {}) == _greedy(plain, {})
