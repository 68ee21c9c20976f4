// SchedulerConfig and RequestParams: the two user-facing parameter sets, validated on entry.
#pragma once

#include <cstdint>
#include <vector>

#include "common.hpp"

namespace deepinfer {

struct SchedulerConfig {
  int32_t block_size = 128;               // tokens per KV block; the prefix-cache grain is one block
  int32_t num_blocks = 4096;              // KV pool capacity in blocks
  int32_t max_num_seqs = 256;             // running (admitted) sequences at most; MTP slot pool size
  int32_t max_num_batched_tokens = 8192;  // rows per step (prefill chunk budget, decode rows)
  int32_t max_model_len = 4096;           // prompt + output limit; longer prompts are ignored
  int32_t nextn = 0;                      // draft rows per decode step, upper bound (0 = no MTP)
  int32_t min_final_chunk_tokens = 128;   // YOCO: last prefill chunk holds >= min(this, prefill) tokens
  bool enable_prefix_caching = true;
  int32_t swa_snapshot_tokens = 0;        // SWA tier grain A (SPEC §5: 128): hits only at multiples of A
                                          //   covered by a registered snapshot; 0 = any block hit
  std::vector<int32_t> eos_token_ids;
  std::vector<int32_t> engram_vocab_map;  // token id -> compressed (Engram) id; empty = off

  // Throws std::invalid_argument naming the field and the limit.
  void validate() const;
  bool has_engram_map() const { return !engram_vocab_map.empty(); }
  // Worst-case KV rows one sequence can hold: max_model_len plus two steps of optimistic rows
  // (ZOS keeps up to two unprocessed steps of 1 + nextn rows each).
  int64_t max_kv_tokens_per_seq() const { return int64_t(max_model_len) + 2 * (nextn + 1); }
};

struct RequestParams {
  int32_t max_tokens = 16;  // output tokens at most (>= 1)
  int32_t min_tokens = 0;   // EOS / stop ids are not honoured before this many output tokens
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;

  void validate() const;
};

}  // namespace deepinfer
