// PrefixCacheStats: what the prefix cache served at each admission, and why a hit fell short.
//
// At admission a prompt of P tokens could hit at most F = P / block_size full blocks, and YOCO
// caps the hit at C = (P - final chunk tokens) / block_size blocks (the kept tail is recomputed).
// The match runs over all F blocks so the cap is told apart from a miss:
//   DISABLED    prefix caching is off
//   YOCO_KEEP   more blocks matched than C: the hit is C blocks (shortened by the kept tail)
//   NONE        exactly C blocks matched: the best hit the policy allows
//   NOT_CACHED  the first block missed (nothing of the prompt is cached)
//   PARTIAL     a later block missed (never cached, or evicted)
// With the SWA tier on (swa_snapshot_tokens = A > 0: window KV lives in per-request rings, so a
// hit also needs the window at its point, SPEC §5) the hit is a multiple of A: L1 = the block hit
// rounded down to A; L1 if a snapshot covers L1 (reason as above), else L1 - A if one covers it:
//   SWA_REPLAY       the hit is L1 - A (the last A tokens of the block hit are recomputed)
//   NO_SWA_SNAPSHOT  blocks matched but no snapshot covers L1 or L1 - A (or L1 - A = 0): no hit
// Preempted sequences re-admitted for recompute are admissions too.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

enum class PrefixMiss : uint8_t {
  NONE = 0, DISABLED = 1, YOCO_KEEP = 2, NOT_CACHED = 3, PARTIAL = 4, SWA_REPLAY = 5, NO_SWA_SNAPSHOT = 6
};
constexpr int kNumPrefixMiss = 7;

inline PrefixMiss classify_prefix_hit(bool enabled, int32_t matched_blocks, int32_t cap_blocks) {
  if (!enabled) return PrefixMiss::DISABLED;
  if (matched_blocks > cap_blocks) return PrefixMiss::YOCO_KEEP;
  if (matched_blocks == cap_blocks) return PrefixMiss::NONE;
  return matched_blocks == 0 ? PrefixMiss::NOT_CACHED : PrefixMiss::PARTIAL;
}

struct PrefixCacheStats {
  int64_t num_admissions = 0;
  int64_t num_prompt_tokens = 0;   // prefill tokens of the admitted sequences
  int64_t num_cached_tokens = 0;   // of which served from the prefix cache
  std::array<int64_t, kNumPrefixMiss> num_by_reason{};  // admissions per PrefixMiss

  void record(PrefixMiss reason, int32_t prefill_len, int32_t cached_tokens) {
    ++num_admissions;
    num_prompt_tokens += prefill_len;
    num_cached_tokens += cached_tokens;
    ++num_by_reason[size_t(reason)];
  }
};

}  // namespace deepinfer
