"""The SWA tier over the window rings (swa_tier.py, SPEC §5) in the engine: warm outputs equal cold
ones token for token in batch-invariant mode at every point of the hit policy (a snapshot at L1;
none at L1 but one at L1 - A: replay; none: miss), with speculation on; the YOCO keep caps the hit;
and the ring layout gives the paged layout's tokens (speculation on and off)."""

import pytest

from deepinfer_engine import LLM, SamplingParams

A = 32            # SWA grain here (W = 32 for the default model; block size 16)
X = [(7 + 37 * i) % 7919 + 4 for i in range(120)]
Y = X + [(11 + 53 * i) % 7919 + 4 for i in range(40)]   # X, then 40 tokens more: 160
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _llm(**kw) -> LLM:
    base = dict(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256,
                enable_mtp_varlen=False, swa_snapshot_tokens=A)
    base.update(kw)
    return LLM(**base)


def _gen(llm: LLM, prompt: list[int]):
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=PARAMS, use_tqdm=False)[0]
    return out.token_ids, out.num_cached_tokens


def _drop(llm: LLM, point: int | None = None) -> None:
    """Evict the host snapshots at `point` (None: all of them)."""
    store = llm.engine.runner.snapshots.store
    for key in [k for k, p in store.points.items() if point is None or p == point]:
        store.drop(key)


@pytest.fixture(scope="module")
def cold() -> dict[str, list[int]]:
    """Reference tokens: the paged layout, no prefix cache, batch-invariant."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    try:
        llm = _llm(window_kv="paged", enable_prefix_caching=False)
        return {"X": _gen(llm, X)[0], "Y": _gen(llm, Y)[0]}
    finally:
        mp.undo()


def test_warm_equals_cold_at_every_policy_point(cold, monkeypatch):
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    llm = _llm()
    eng = llm.engine
    keep = eng.scheduler.config.min_final_chunk_tokens
    assert keep == 32 + eng.envs.max_backtracking_tokens                  # W + backtracking (SPEC: 134)
    assert _gen(llm, X) == (cold["X"], 0)                                  # cold, ring layout
    assert sorted(eng.runner.snapshots.store.points.values()) == [64, 96]  # the chunks' last crossings
    # warm X: blocks cap at (120 - keep) // 16 * 16 = 80, L1 = 64 has a snapshot: YOCO-truncated hit
    assert _gen(llm, X) == (cold["X"], 64)
    # Y: 112 tokens of X's blocks (prompt + committed outputs), L1 = 96: snapshot -> hit 96
    assert _gen(llm, Y) == (cold["Y"], 96)
    _drop(llm, 96)
    _drop(llm, 128)                                                         # Y's own crossing
    assert _gen(llm, Y) == (cold["Y"], 64)                                  # L1 - A = 64: replay 32 tokens
    _drop(llm)
    assert _gen(llm, Y) == (cold["Y"], 0)                                   # no snapshot: a miss
    reasons = eng.scheduler.prefix_cache_stats().num_by_reason
    assert (reasons["YOCO_KEEP"], reasons["SWA_REPLAY"], reasons["NO_SWA_SNAPSHOT"]) == (1, 1, 1)
    assert eng.stats.num_prefix_cached_tokens == 64 + 96 + 64
    assert eng.runner.snapshots.num_restored == 3


@pytest.mark.parametrize("nextn", [0, 5])
def test_ring_layout_gives_the_paged_tokens(nextn):
    prompts = [X[:50], Y[:90], X[:17]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for layout in ("ring", "paged"):
        llm = _llm(window_kv=layout, num_speculative_tokens=nextn, enable_prefix_caching=False)
        outs[layout] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                            use_tqdm=False)]
        assert (llm.engine.runner.kv_cache.layout.ring is not None) == (layout == "ring")
    assert outs["ring"] == outs["paged"]


@pytest.mark.gpu
def test_warm_equals_cold_on_cuda(monkeypatch):
    """The rings and the SWA tier on CUDA (graphs, ZOS, pinned host snapshots): a hit at L1 restores
    the ring and gives the cold tokens."""
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    want = _gen(_llm(device="cuda", window_kv="ring", enable_prefix_caching=False), Y)[0]
    llm = _llm(device="cuda", window_kv="ring")
    assert _gen(llm, X)[1] == 0
    assert _gen(llm, Y) == (want, 96)
    assert llm.engine.runner.snapshots.num_restored == 1
