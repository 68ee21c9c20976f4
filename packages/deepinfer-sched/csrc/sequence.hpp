// Sequence: one request's tokens, status and rolling counters (KV ledger, MTP state, blocks).
//
// Counters, not phases. L = token_ids.size() (prompt + appended outputs); `cache.num_tokens`
// counts KV rows already written or scheduled to be written (optimistically, before sampling);
// `cache.num_uncommitted_rows` counts the rows of scheduled steps whose outputs are not yet
// processed. Everything else is derived:
//   committed KV rows     = num_tokens - num_uncommitted_rows
//   needs prefill         = num_tokens < prefill_len      (prefill_len: tokens to prefill since
//                                                          admission; L at a recompute)
//   decode, all processed : committed == L - 1            (the last token, the "golden" token,
//                                                          has no KV yet: it is row 0 of the step)
//
// ZOS counter timeline (zero-overhead scheduling: schedule(N+1) runs BEFORE process_outputs(N),
// so a sequence can carry two unprocessed steps). nextn = 2; step N keeps 2 rows (1 draft
// accepted + golden), step N+1 keeps 1. c = num_tokens, u = num_uncommitted_rows.
//
//   call                       L    c    u   rows written (positions)
//   -------------------------  --   --   -   -------------------------------------------------
//   all processed              10    9   0   c == L - 1: golden token t9 sits at position 9
//   schedule(N)    rows = 3    10   12   3   9 10 11          advance: c += rows
//   schedule(N+1)  rows = 3    10   15   6            12 13 14 upper bound: assumes N kept all 3
//   process(N)     kept = 2    12   14   3   commit by delta c -= rows - kept (never overwrite:
//                                            c already holds N+1's advance); L += 2
//   process(N+1)   kept = 1    13   12   0   c -= 3 - 1  ->  c == L - 1 again
//
// The device runs N+1 at its true start 9 + kept_N = 11, i.e. the CPU position minus the rows
// N rejected (rows_N - kept_N, known on the device when N+1 launches); SchedulerOutput carries
// remap and num_uncommitted_rows for that correction. Blocks are allocated for the CPU upper
// bound, so the true rows always have a slot. Without ZOS the delta commit equals the classic
// `num_tokens = previous_num_tokens + kept`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common.hpp"
#include "config.hpp"
#include "prefix_stats.hpp"

namespace deepinfer {

// KV-row counters of one sequence (see the timeline above).
struct CacheCounters {
  int32_t num_tokens = 0;           // KV rows written or scheduled (optimistic upper bound)
  int32_t previous_num_tokens = 0;  // num_tokens before the latest advance
  int32_t num_uncommitted_rows = 0; // rows of scheduled, unprocessed steps inside num_tokens
  int32_t num_inflight_steps = 0;   // scheduled, unprocessed steps

  void advance_optimistically(int32_t seqlen_q) {
    previous_num_tokens = num_tokens;
    num_tokens += seqlen_q;
    num_uncommitted_rows += seqlen_q;
    num_inflight_steps += 1;
  }
  // Settles one processed step: `rows_scheduled` were counted at schedule time, `rows_kept`
  // hold valid KV (prefill: the chunk; decode: tokens appended). Delta form, so a later
  // step's advance is never overwritten. Throws LedgerError on an impossible commit.
  void commit_processed_tokens(int64_t request_id, int32_t rows_scheduled, int32_t rows_kept);
  int32_t num_committed_tokens() const { return num_tokens - num_uncommitted_rows; }
};

// Multi-token-prediction state carried across steps.
struct MtpState {
  int32_t info_slot = 0;            // MTP info pool slot (>= 1 while running with nextn > 0; 0 = none)
  int32_t last_output_token = -1;   // main token of the last processed step (next golden token)
  int32_t num_drafts_next = -1;     // drafts for the next decode step; -1 = config nextn (one-shot)
  std::vector<float> prev_confidence;  // [<= nextn] confidences of the drafts to verify next
};

class Sequence {
 public:
  Sequence(int64_t request_id, std::vector<int32_t> prompt, RequestParams params, int64_t arrival,
           const std::vector<int32_t>* engram_map);

  int64_t request_id;
  RequestParams params;
  int64_t arrival;  // monotone admission-order key (FCFS / LCFS tie-breaks)
  int32_t prompt_len;
  std::vector<int32_t> token_ids;             // [L] prompt then outputs
  std::vector<int32_t> compressed_token_ids;  // [L] engram ids (empty when no map)
  SequenceStatus status = SequenceStatus::WAITING;
  int32_t stop_token_id = -1;  // token that finished it with reason "stop", else -1
  int32_t prefill_len;         // tokens to prefill since (re)admission
  int32_t epoch = 0;           // bumped by each preemption: steps of an older epoch are stale

  CacheCounters cache;
  MtpState mtp;

  std::vector<int32_t> block_table;  // block ids covering positions [0, num_tokens)
  int32_t state_slot = 0;            // state slot (window rings, stage) while running; 0 = none
  int32_t num_cached_tokens = 0;     // prompt tokens the prefix cache served at the latest admission
  PrefixMiss prefix_miss = PrefixMiss::NONE;  // why that hit fell short (prefix_stats.hpp)
  int32_t num_hashed_blocks = 0;     // leading blocks registered in the prefix cache
  uint64_t last_block_hash = 0;      // hash chain value of block num_hashed_blocks - 1
  std::vector<uint64_t> chain_hashes;  // [num_hashed_blocks] hash chain value of each leading block

  int64_t last_scheduled_step = -1;  // step id / row-block index of its latest scheduling (remap)
  int32_t last_scheduled_index = -1;

  int32_t num_tokens_total() const { return int32_t(token_ids.size()); }
  int32_t output_len() const { return num_tokens_total() - prompt_len; }
  int32_t last_token_id() const { return token_ids.back(); }
  bool is_finished() const { return deepinfer::is_finished(status); }
  bool needs_prefill() const { return cache.num_tokens < prefill_len; }

  void append_token_id(int32_t token, const std::vector<int32_t>* engram_map);
  // Takes the draft count of the next decode step (one-shot override, else `nextn`).
  int32_t take_num_drafts(int32_t nextn);
  // Back to WAITING with no KV: every rolling field together (KV counters, in-flight counts,
  // MTP state, block-hash progress, remap history); the tokens so far become the new prefill.
  // The caller must have freed the blocks and the MTP slot first (checked).
  void reset_for_recompute();
};

using SeqPtr = std::shared_ptr<Sequence>;

}  // namespace deepinfer
