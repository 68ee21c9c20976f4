"""Acceptance 7: reference vs engine-path forward for `tiny` on the CPU.

Run: pytest packages/deepinfer-model/benchmarks --benchmark-only
Prefill: 4 prompts (96, 64, 40, 16 tokens) in one chunk each. Decode: one step of the same batch
with 2 draft rows per request (3 rows each), over the cache the prefill left.
The reference runs each sequence densely (it has no batching and no cache: a decode step of
the reference is a full re-run of the sequence, which is what the engine path saves).
"""


import pytest
import torch

from deepinfer_model.testing import Driver, Seq, tiny_model

LENS = [96, 64, 40, 16]


def _seqs():
    g = torch.Generator().manual_seed(0)
    return [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in LENS]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return tiny_model()


def test_bench_reference_prefill(benchmark, model):
    seqs = _seqs()

    def run():
        return [model.reference_forward(torch.tensor(s.tokens), mode="bounded_replay", prompt_len=s.prompt_len,
                                        kv_quant=True).logits[-1] for s in seqs]

    out = benchmark(run)
    assert len(out) == 4 and all(bool(torch.isfinite(o).all()) for o in out)


def test_bench_engine_prefill(benchmark, model):
    def setup():
        seqs = _seqs()
        return (Driver(model, num_blocks=48, block_size=8), seqs), {}

    def run(drv, seqs):
        return drv.prefill(seqs, LENS)[1]

    out = benchmark.pedantic(run, setup=setup, rounds=10)
    assert out.logits.shape == (4, model.config.vocab_size)


def test_bench_engine_decode_step(benchmark, model):
    seqs = _seqs()
    drv = Driver(model, num_blocks=48, block_size=8)
    _, out = drv.prefill(seqs, LENS)
    for s, lg in zip(seqs, out.logits, strict=False):
        s.tokens.append(int(lg.argmax()))
    res = benchmark(lambda: drv.decode(seqs, [[7, 8] for _ in seqs])[1])
    assert res.logits.shape == (12, model.config.vocab_size)


def test_bench_reference_decode_step(benchmark, model):
    seqs = _seqs()
    for s in seqs:
        s.tokens += [5, 7, 8]

    def run():
        return [model.reference_forward(torch.tensor(s.tokens), mode="bounded_replay", prompt_len=s.prompt_len,
                                        kv_quant=True).logits[-3:] for s in seqs]

    out = benchmark(run)
    assert all(o.shape == (3, model.config.vocab_size) for o in out)


def test_bench_engine_dspark_draft(benchmark, model):
    seqs = _seqs()
    drv = Driver(model, num_blocks=48, block_size=8)
    meta, out = drv.prefill(seqs, LENS, features=True)
    model.dspark_write_main_keys(meta, out, drv.cache)
    dm = drv.draft_meta(seqs, [int(x) for x in out.logits.argmax(-1)])
    res = benchmark(model.dspark_draft, dm, drv.cache)
    assert res.token_ids.shape == (4, model.config.nextn)
