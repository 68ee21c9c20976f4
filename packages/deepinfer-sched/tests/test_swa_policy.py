"""The SWA tier's hit policy (SPEC §5, prefix_stats.hpp): with `swa_snapshot_tokens = A` a hit is a
multiple of A whose window snapshot the engine registered: L1 (the block hit rounded down to A) if
one covers L1, else L1 - A (SWA_REPLAY), else no hit (NO_SWA_SNAPSHOT). The ledger reports each
crossing of a multiple of A (`swa_points` / `swa_keys`: the key a later admission looks up), and
the first chunk of an admission with a hit carries `restore_tokens` / `restore_keys`."""

import numpy as np
import pytest

from deepinfer_sched import VERIFIED_END, PrefixMiss, RequestParams
from deepinfer_sched.testing import prefill_alone, small_scheduler

A = 8
PROMPT = list(range(3, 3 + 30))   # 30 tokens: multiples of A at 8, 16, 24


def make(**kw):
    return small_scheduler(**{"max_num_seqs": 8, "min_final_chunk_tokens": 4, "swa_snapshot_tokens": A, **kw})


def run_prefill(s, rid, prompt):
    """Admit and prefill `prompt` in one step -> (cached, reason, restore, crossings {point: key})."""
    out, (cached, reason) = prefill_alone(s, rid, prompt)
    restore = (int(out.restore_tokens[0]), int(out.restore_keys[0]))
    assert restore[0] == cached
    return cached, reason, restore, {int(p): int(k) for p, k in zip(out.swa_points, out.swa_keys) if p}


def test_hits_need_a_snapshot_at_their_point():
    s = make()
    cached, reason, restore, crossed = run_prefill(s, 1, PROMPT)
    assert (cached, reason, restore) == (0, PrefixMiss.NOT_CACHED, (0, 0))
    assert list(crossed) == [24]                         # the latest multiple of A the prefill crossed
    # blocks cover 26 tokens (YOCO cap: (30 - 4) // 4 = 6 blocks = 24), but no snapshot: no hit
    assert run_prefill(s, 2, PROMPT)[:2] == (0, PrefixMiss.NO_SWA_SNAPSHOT)
    s.add_swa_snapshot(crossed[24])
    cached, reason, restore, _ = run_prefill(s, 3, PROMPT)
    assert (cached, reason, restore) == (24, PrefixMiss.YOCO_KEEP, (24, crossed[24]))
    assert s.remove_swa_snapshot(crossed[24]) and not s.remove_swa_snapshot(crossed[24])
    st = s.prefix_cache_stats()
    assert st.num_by_reason["NO_SWA_SNAPSHOT"] == 1 and st.num_cached_tokens == 24


def test_replay_one_grain_back_and_keys_are_prefix_hashes():
    s = make()
    keys = {}
    for rid, n in ((1, 12), (2, 20), (5, 28)):   # crossings at 8, 16, 24 (prefixes of PROMPT)
        keys.update(run_prefill(s, rid, PROMPT[:n])[3])
    assert sorted(keys) == [8, 16, 24]
    s.add_swa_snapshot(keys[16])
    # L1 = 24 (no snapshot), L1 - A = 16 has one: hit 16, the last A tokens recomputed
    cached, reason, restore, _ = run_prefill(s, 3, PROMPT)
    assert (cached, reason, restore) == (16, PrefixMiss.SWA_REPLAY, (16, keys[16]))
    s.remove_swa_snapshot(keys[16])
    s.add_swa_snapshot(keys[8])   # two grains back: no hit (the policy looks at L1 and L1 - A only)
    assert run_prefill(s, 4, PROMPT)[:2] == (0, PrefixMiss.NO_SWA_SNAPSHOT)


def test_decode_crossings_are_reported_once_with_the_committed_prefix_key():
    s = make(nextn=2)
    s.add_request(1, PROMPT[:6], RequestParams(max_tokens=20, ignore_eos=True))
    out = s.schedule()
    s.process_outputs(out, np.array([50], np.int32), np.full(out.total_q, VERIFIED_END, np.int32))
    seen = []
    for step in range(8):   # 3 rows a step, accept one draft: 2 tokens a step
        out = s.schedule()
        ver = np.full(out.total_q, VERIFIED_END, np.int32)
        ver[0] = 60 + step
        s.process_outputs(out, np.array([70 + step], np.int32), ver)
        seen += [int(p) for p in out.swa_points if p]
    assert seen == [8, 16]


def test_config_checks_the_grain():
    with pytest.raises(ValueError, match="swa_snapshot_tokens"):
        make(swa_snapshot_tokens=6)
