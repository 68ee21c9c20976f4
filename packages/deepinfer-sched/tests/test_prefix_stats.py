"""Prefix-cache accounting: cached tokens per request (at admission) and admissions counted by
the reason a hit fell short of the policy's best (PrefixMiss)."""

from deepinfer_sched import PrefixMiss
from deepinfer_sched.testing import prefill_alone, small_scheduler

PROMPT = list(range(3, 3 + 22))   # 22 tokens = 5 full blocks of 4 + 2


def make(**kw):
    return small_scheduler(max_num_seqs=8, max_model_len=48, min_final_chunk_tokens=6, **kw)


def run_one(s, rid, prompt):
    """-> (cached tokens, PrefixMiss) of the admission."""
    return prefill_alone(s, rid, prompt)[1]


def test_reasons_and_counters():
    s = make()
    assert run_one(s, 1, PROMPT) == (0, PrefixMiss.NOT_CACHED)        # cold
    # the same prompt: 5 blocks match, the kept tail (6 tokens) caps the hit at (22 - 6) // 4 = 4 blocks
    assert run_one(s, 2, PROMPT) == (16, PrefixMiss.YOCO_KEEP)
    # 4 tokens more: the cap is (26 - 6) // 4 = 5 blocks, 5 match: the best the policy allows
    assert run_one(s, 3, PROMPT + [40, 41, 42, 43]) == (20, PrefixMiss.NONE)
    # block 2 differs: 2 blocks hit, then a miss
    assert run_one(s, 4, PROMPT[:8] + [50] * 14) == (8, PrefixMiss.PARTIAL)
    st = s.prefix_cache_stats()
    assert st.num_admissions == 4 and st.num_prompt_tokens == 22 + 22 + 26 + 22
    assert st.num_cached_tokens == 16 + 20 + 8
    assert st.num_by_reason == {"NONE": 1, "DISABLED": 0, "YOCO_KEEP": 1, "NOT_CACHED": 1, "PARTIAL": 1,
                                "SWA_REPLAY": 0, "NO_SWA_SNAPSHOT": 0}


def test_disabled_cache_counts_every_admission_as_disabled():
    s = make(enable_prefix_caching=False)
    for rid in range(3):
        assert run_one(s, rid, PROMPT) == (0, PrefixMiss.DISABLED)
    st = s.prefix_cache_stats()
    assert st.num_by_reason["DISABLED"] == 3 and st.num_cached_tokens == 0 and st.num_prompt_tokens == 66
