"""The default model's training tools: packed corpus integrity, deterministic batches, evaluation rules
(function prompts, completion cut, calibration), self-distillation targets."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from default_model import data, evaluation, modeling  # noqa: E402


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus()


def test_packed_corpus_matches_manifest(corpus):
    m = corpus.manifest
    assert m["python"] == "3.11.7" and m["vocab_size"] == 8192
    assert len(corpus.train_docs) == len(m["train"]) and corpus.train_tokens == m["train_tokens_total"]
    assert {f["module"] for f in m["train"]}.isdisjoint({f["module"] for f in m["held_out"]})
    assert all(int(d.max()) < 8192 and int(d.min()) > 6 for d in corpus.train_docs if len(d))  # no special ids
    assert (ROOT / "tools/data" / m["data_files"]["train_tokens"]["name"]).stat().st_size < 3_000_000


def test_tokenizer_mismatch_fails_loudly(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(data.CorpusError, match="sha256"):
        data.load_corpus(tokenizer_path=bad)


def test_batches_are_deterministic_and_cover_epochs(corpus):
    docs = corpus.train_docs[:20]
    a = data.BatchStream(docs, 32, 4, seed=7, bos=1, eos=2)
    b = data.BatchStream(docs, 32, 4, seed=7, bos=1, eos=2)
    c = data.BatchStream(docs, 32, 4, seed=8, bos=1, eos=2)
    xs = [a.next_batch() for _ in range(3 * a.chunks_per_epoch // 4 + 2)]   # crosses epoch boundaries
    ys = [b.next_batch() for _ in range(len(xs))]
    assert all(np.array_equal(x, y) for x, y in zip(xs, ys, strict=True))
    assert not np.array_equal(xs[0], c.next_batch())
    assert xs[0].shape == (4, 33) and a.epoch >= 2
    total = sum(len(d) + 2 for d in docs)
    assert (np.concatenate(xs) == 1).sum() > 0 and a.chunks_per_epoch == total // 33


def test_held_out_windows_score_every_token_once():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            class E:
                ids = [10 + (ord(ch) % 50) for ch in text]
            return E()
    texts = ["x" * 300, "abc", "y" * 64]
    wins, first = data.held_out_token_chunks(texts, Tok(), 1, 2, ctx=64, overlap=16)
    scored = sum(len(w) - f for w, f in zip(wins, first, strict=True))
    assert scored == sum(len(t) + 1 for t in texts)          # every token after <|bos|>, incl. <|eos|>
    assert all(len(w) <= 64 for w in wins)


def test_function_prompts_are_deterministic(corpus):
    a = evaluation.function_prompts(corpus.held_out, 100)
    b = evaluation.function_prompts(corpus.held_out, 100)
    assert len(a) == 100 and a == b
    assert all(f["header"].lstrip().startswith(("def ", "async def ")) and f["header"].rstrip().endswith(":")
               for f in a)
    assert all('"""' not in f["context"] for f in a[:30])          # docstring-free context
    # the rules accept the held-out functions' real bodies
    assert all(evaluation.parses(evaluation.cut_completion(f["header"], "\n" + f["reference_body"], False))
               for f in a)


H = "    def f(self, x):"


@pytest.mark.parametrize("completion,hit,expected,ok", [
    ("\n        return x\n\n    def g(self):\n", False, H + "\n        return x\n", True),       # blank line
    ("\n        return x\n    def g(self):\n        pass\n", False, H + "\n        return x\n", True),  # dedent
    ("\n        y = x\n        z = y +", True, H + "\n        y = x\n", True),          # unfinished last line
    ("\n        y = x\n        return (y,\n                1", True, H + "\n        y = x\n        return (y,\n",
     False),
    ("\n        y = x\n        return y", False, H + "\n        y = x\n        return y\n", True),  # EOS
])
def test_cut_completion(completion, hit, expected, ok):
    got = evaluation.cut_completion(H, completion, hit)
    assert got == expected
    assert evaluation.parses(got) == ok


def test_blank_lines_in_docstrings_cut_only_in_the_main_rule():
    comp = '\n    """Summary.\n\n    More.\n    """\n    return 1\n\n'
    assert not evaluation.parses(evaluation.cut_completion("def f():", comp, False))
    assert evaluation.parses(evaluation.cut_completion_code_blank("def f():", comp, False))


def test_calibration_table():
    conf = torch.tensor([0.05, 0.15, 0.95, 0.95, 0.55])
    acc = torch.tensor([False, False, True, False, True])
    cal = evaluation.calibration(conf, acc)
    assert cal["pairs"] == 5 and len(cal["reliability"]) == 10
    assert cal["reliability"][9]["count"] == 2 and cal["reliability"][9]["accept_rate"] == 0.5
    assert abs(cal["brier"] - float(((conf - acc.float()) ** 2).mean())) < 1e-6


def test_draft_targets_generated_and_real():
    toks = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    anchors = torch.tensor([[1, 4]])
    labels, prev, valid = modeling.draft_targets(toks, anchors, None, 3)
    assert labels[0, 0].tolist() == [8, 9, 10] and prev[0, 0].tolist() == [7, 8, 9]
    assert valid[0, 1].tolist() == [True, True, False]               # anchor 4: labels 6, 7 exist
    greedy = torch.tensor([[6, 7, 8, 0, 10, 11, 12, 13]])              # greedy[t] predicts t + 1
    labels, prev, valid = modeling.draft_targets(toks, torch.tensor([[0, 3]]), greedy, 3)
    # anchor 0: main token 6 == greedy[0]; real 7 == greedy[1]; real 8 == greedy[2]
    assert labels[0, 0].tolist() == [7, 8, 0] and valid[0, 0].tolist() == [True, True, True]
    # anchor 3: main token 9 != greedy[3] = 0: the target would never have produced it
    assert valid[0, 1].tolist() == [False, False, False]


def test_lr_schedule():
    assert modeling.lr_at(0, 100, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert modeling.lr_at(9, 100, 1.0, 10, 0.1) == pytest.approx(1.0)
    assert modeling.lr_at(100, 100, 1.0, 10, 0.1) == pytest.approx(0.1)
    # warm-up does not depend on the total (a calibrated step count replays the same first steps)
    assert [modeling.lr_at(s, 100, 1.0, 10, 0.1) for s in range(10)] == \
        [modeling.lr_at(s, 5000, 1.0, 10, 0.1) for s in range(10)]


def test_step_plan_calibrates_cuts_and_stops(monkeypatch):
    """StepPlan (both training phases): steps 5 .. calib_at are timed, the plan is cut to what fits
    before the deadline, and keep_going turns False once the clock passes deadline + slack."""
    from default_model import phases

    clock = {"t": 0.0}
    monkeypatch.setattr(phases.time, "time", lambda: clock["t"])
    logs = []
    plan = phases.StepPlan("lm", 400, True, deadline=100.0, slack_s=15, log=lambda kind, **kw: logs.append(kind))
    assert plan.calib_at == 30
    for step in range(31):                 # 1 s per step: 70 s left at step 30 fit 66 more steps
        assert plan.keep_going(step)
        clock["t"] += 1.0
    assert plan.planned == 30 + int(0.95 * 70 / 1.0) and logs == ["plan", "calibrated"]
    clock["t"] = 116.0
    assert not plan.keep_going(31) and logs[-1] == "stop"
    # calib_at == 5 (20-23 requested steps): no interval to time, so no calibration (was a division by zero)
    short = phases.StepPlan("draft", 21, True, deadline=1e9, slack_s=10, log=lambda kind, **kw: None)
    assert short.calib_at == 5 and all(short.keep_going(s) for s in range(21)) and short.planned == 21
