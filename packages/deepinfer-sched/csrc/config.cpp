#include "config.hpp"

namespace deepinfer {

namespace {
void require_positive(const char* field, int64_t v) {
  if (v < 1) fail_value("SchedulerConfig.", field, " must be >= 1, got ", v);
}
}  // namespace

void SchedulerConfig::validate() const {
  require_positive("block_size", block_size);
  require_positive("num_blocks", num_blocks);
  require_positive("max_num_seqs", max_num_seqs);
  require_positive("max_num_batched_tokens", max_num_batched_tokens);
  require_positive("max_model_len", max_model_len);
  if (nextn < 0 || nextn > kMaxNextn)
    fail_value("SchedulerConfig.nextn must be in [0, ", kMaxNextn, "], got ", nextn);
  if (min_final_chunk_tokens < 0)
    fail_value("SchedulerConfig.min_final_chunk_tokens must be >= 0, got ", min_final_chunk_tokens);
  // A last chunk of min_final_chunk_tokens must fit one step, or a long prompt could never finish.
  if (min_final_chunk_tokens > max_num_batched_tokens)
    fail_value("SchedulerConfig.min_final_chunk_tokens (", min_final_chunk_tokens,
               ") must be <= max_num_batched_tokens (", max_num_batched_tokens, ")");
  // Any admissible sequence must fit the pool alone, or it could preempt itself forever.
  if (int64_t(num_blocks) * block_size < max_kv_tokens_per_seq())
    fail_value("SchedulerConfig.num_blocks * block_size (", int64_t(num_blocks) * block_size,
               ") must be >= max_model_len + 2 * (nextn + 1) = ", max_kv_tokens_per_seq(),
               " so that one sequence always fits the KV pool");
  if (swa_snapshot_tokens < 0 || (swa_snapshot_tokens > 0 && swa_snapshot_tokens % block_size != 0))
    fail_value("SchedulerConfig.swa_snapshot_tokens must be 0 or a positive multiple of block_size (",
               block_size, "), got ", swa_snapshot_tokens);
  for (int32_t t : eos_token_ids)
    if (t < 0) fail_value("SchedulerConfig.eos_token_ids must be >= 0, got ", t);
  for (size_t i = 0; i < engram_vocab_map.size(); ++i)
    if (engram_vocab_map[i] < 0)
      fail_value("SchedulerConfig.engram_vocab_map[", i, "] must be >= 0, got ", engram_vocab_map[i]);
}

void RequestParams::validate() const {
  if (max_tokens < 1) fail_value("RequestParams.max_tokens must be >= 1, got ", max_tokens);
  if (min_tokens < 0) fail_value("RequestParams.min_tokens must be >= 0, got ", min_tokens);
  if (min_tokens > max_tokens)
    fail_value("RequestParams.min_tokens (", min_tokens, ") must be <= max_tokens (", max_tokens, ")");
  for (int32_t t : stop_token_ids)
    if (t < 0) fail_value("RequestParams.stop_token_ids must be >= 0, got ", t);
}

}  // namespace deepinfer
