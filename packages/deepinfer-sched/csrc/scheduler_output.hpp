// SchedulerOutput: one step's plan (C++ -> Python) plus the ledger facts recorded when the step's
// samples are processed (process_outputs) and consumed by build_request_outputs.
//
// Flat rows (total_q, device side) and requests (req_cnt, CPU side) meet through
// first_token_pos, the exclusive prefix sum of seqlens_q:
//
//   seqlens_q        [4, 2, 1]
//   first_token_pos  [0, 4, 6]        total_q = 7
//   rows             0 1 2 3 | 4 5 | 6
//   request          A A A A | B B | C
//   row kind         g d d d | g d | g     g = golden (committed last token), d = draft to verify
#pragma once

#include <cstdint>
#include <vector>

#include "common.hpp"
#include "sequence.hpp"

namespace deepinfer {

struct SchedulerOutput {
  int64_t step_id = -1;
  StepKind step_kind = StepKind::IDLE;
  int32_t nextn = 0;        // config nextn (width of the confidence rows)
  int32_t block_size = 0;
  int32_t max_blocks = 0;   // columns of block_tables

  // --- per request [req_cnt] ---
  std::vector<int64_t> request_ids;
  std::vector<int32_t> seqlens_q;            // rows of the request (prefill chunk, or 1 + drafts)
  std::vector<int32_t> first_token_pos;      // exclusive prefix sum of seqlens_q
  std::vector<int32_t> num_computed_tokens;  // KV rows counted before this step (= first row's position)
  std::vector<int32_t> context_lens;         // num_computed_tokens + seqlens_q
  std::vector<int32_t> prompt_lens;
  std::vector<uint8_t> is_last_chunk;        // prefill: chunk ends the prefill (samples); decode: 1
  std::vector<int32_t> mtp_slots;            // MTP info slot (>= 1), 0 = none (nextn == 0)
  std::vector<int32_t> state_slots;          // state slot (>= 1): the request's window rings and stage
  std::vector<int32_t> remap;                // index in the previous step's request_ids, -1 if absent
  std::vector<int32_t> num_uncommitted_rows; // rows of earlier unprocessed steps counted in
                                             // num_computed_tokens (ZOS: upper-bound slack)
  std::vector<int32_t> block_tables;         // [req_cnt, max_blocks] row-major, -1 padded
  std::vector<int32_t> restore_tokens;       // SWA tier: first chunk after an admission with a hit: the
                                             //   hit length L (restore the rings' window at L), else 0
  std::vector<uint64_t> restore_keys;        // snapshot key (prefix chain hash at L) where restore_tokens > 0
  // --- per row [total_q] ---
  std::vector<int32_t> positions;
  std::vector<int32_t> input_token_ids;      // -1 where the device fills the token
  std::vector<int32_t> input_engram_ids;     // compressed ids of input_token_ids (empty: no map)
  std::vector<int64_t> slot_mapping;         // block_id * block_size + offset

  std::vector<int64_t> ignored_request_ids;
  std::vector<int64_t> aborted_request_ids;
  std::vector<int64_t> preempted_request_ids;

  // --- internal: sequences and their epochs at schedule time ---
  std::vector<SeqPtr> seqs;
  std::vector<int32_t> epochs;
  std::vector<SeqPtr> ignored_seqs;
  std::vector<SeqPtr> aborted_seqs;

  // --- ledger facts, written by process_outputs ---
  bool processed = false;
  std::vector<int32_t> pushed;             // tokens appended before finish (pushed_tokens_before_finish)
  std::vector<int32_t> num_accepted;       // accepted drafts per request
  std::vector<int32_t> kept_rows;          // KV rows the commit kept (prefill: chunk; decode: pushed)
  std::vector<int32_t> output_len_before;  // output_len before this step's appends
  std::vector<uint8_t> finish_reason;      // FinishReason reached in this step (NONE if none)
  std::vector<int32_t> stop_token_id;      // token that stopped it in this step, else -1
  std::vector<float> step_confidence;      // [req_cnt, nextn] confidences of the verified drafts
  std::vector<int32_t> num_step_confidence;// valid entries of each step_confidence row
  std::vector<int32_t> swa_points;         // SWA tier: multiple of swa_snapshot_tokens the committed rows
                                           //   crossed in this step (the latest), 0 = none
  std::vector<uint64_t> swa_keys;          // prefix chain hash at swa_points[i] (the snapshot's key)

  int32_t req_cnt() const { return int32_t(request_ids.size()); }
  int32_t total_q() const { return int32_t(positions.size()); }
};

}  // namespace deepinfer
