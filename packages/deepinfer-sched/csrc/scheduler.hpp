// Scheduler: admission, chunked prefill, LCFS decode with preemption-by-recompute, MTP info slots,
// and the ledger commit of each step's samples (process_outputs, in process_outputs.cpp).
//
// Policy (one step is PREFILL or DECODE, never mixed):
//   1. Prefill first: continue chunked prefills (admission order), then admit waiting sequences
//      FCFS while running < max_num_seqs, the row budget lasts and their blocks fit. The last
//      chunk of a prefill holds >= min(min_final_chunk_tokens, prefill_len) tokens (YOCO
//      bounded replay needs them in one chunk): an earlier chunk is shortened to keep them.
//   2. Otherwise decode every running sequence whose prefill is done, last admitted first
//      (LCFS), with 1 + drafts rows each under the row budget. When blocks run out, preempt the
//      unscheduled running sequence with the shortest output (it recomputes later).
// A running sequence owns one MTP info slot (>= 1) while nextn > 0, and one state slot (>= 1,
// its window rings and compressor stage: state_slots.hpp) always:
//   used slots == running sequences (each kind), checked after every schedule() and process_outputs().
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "block_manager.hpp"
#include "config.hpp"
#include "scheduler_output.hpp"
#include "sequence.hpp"
#include "state_slots.hpp"

namespace deepinfer {

// Arguments of process_outputs: the device's samples for one SchedulerOutput (SampledInfo).
struct SampledInfo {
  const int32_t* token_ids = nullptr;           // [req_cnt] main token per request
  size_t num_token_ids = 0;
  const int32_t* verified_token_ids = nullptr;  // [total_q] accepted drafts, -1 terminated; may be null
  size_t num_verified = 0;
  const float* confidence = nullptr;            // [req_cnt, nextn] next step's draft confidences; may be null
  size_t confidence_rows = 0, confidence_cols = 0;
  const int32_t* first_token_positions = nullptr;  // [req_cnt] device-side ftp to cross-check; may be null
  size_t num_ftp = 0;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);

  void add_request(int64_t request_id, std::vector<int32_t> prompt_token_ids, RequestParams params);
  // Finishes the request now (blocks and slot freed); its one final output ("abort") rides on the
  // next schedule()'s output. Returns false for an unknown or already finished request.
  bool abort_request(int64_t request_id);
  // Per-request draft count for the next decode step (clipped to [0, nextn] by validation).
  void set_num_drafts(const int64_t* request_ids, const int32_t* num_drafts, size_t n);

  // `forced`: run this kind of step (DP step-type vote) or IDLE; nullopt = the policy above.
  std::shared_ptr<SchedulerOutput> schedule(std::optional<StepKind> forced = std::nullopt);
  // Commits one step's samples; returns pushed_tokens_before_finish [req_cnt].
  std::vector<int32_t> process_outputs(SchedulerOutput& out, const SampledInfo& sampled);

  bool has_unfinished() const;
  bool has_prefill_work() const;
  bool has_decode_work() const;
  int32_t num_waiting() const { return int32_t(waiting_.size()); }
  int32_t num_running() const { return int32_t(running_.size()); }
  int32_t num_used_mtp_slots() const { return config_.nextn > 0 ? config_.max_num_seqs - int32_t(free_slots_.size()) : 0; }
  int32_t num_used_state_slots() const { return state_slots_.num_used(); }
  const SchedulerConfig& config() const { return config_; }
  const BlockManager& block_manager() const { return blocks_; }
  const PrefixCacheStats& prefix_cache_stats() const { return prefix_stats_; }
  // Copy of a live (waiting or running) sequence's state, or nullptr.
  std::shared_ptr<Sequence> snapshot(int64_t request_id) const;
  // SWA tier (swa_snapshot_tokens > 0): the snapshot keys the engine holds (its host store). A hit
  // needs the window at its point: admission checks these (apply_swa_policy).
  void add_swa_snapshot(uint64_t key) { swa_keys_.insert(key); }
  bool remove_swa_snapshot(uint64_t key) { return swa_keys_.erase(key) > 0; }
  int32_t num_swa_snapshots() const { return int32_t(swa_keys_.size()); }
  std::mutex& mutex() const { return mu_; }

 private:
  const std::vector<int32_t>* engram_map() const { return config_.has_engram_map() ? &config_.engram_vocab_map : nullptr; }
  int32_t final_chunk_tokens(int32_t prefill_len) const;
  int32_t prefill_chunk_len(const Sequence& seq, int32_t budget) const;
  bool schedule_prefill(SchedulerOutput& out);
  bool schedule_decode(SchedulerOutput& out);
  void add_rows(SchedulerOutput& out, const SeqPtr& seq, int32_t rows, bool is_last_chunk, bool is_decode);
  void preempt(const SeqPtr& seq, SchedulerOutput& out);
  void release_resources(Sequence& seq);
  void allocate_mtp_slot(Sequence& seq);
  void release_mtp_slot(Sequence& seq);
  void check_stop(Sequence& seq, int32_t token) const;
  void check_slot_invariant(const char* where) const;
  PrefixHit apply_swa_policy(const Sequence& seq, PrefixHit hit, PrefixMiss& reason, uint64_t& key) const;
  void record_swa_point(SchedulerOutput& out, int32_t i, const Sequence& seq, int32_t committed_before) const;
  void reserve(SchedulerOutput& out) const;
  void finalize(SchedulerOutput& out) const;

  SchedulerConfig config_;
  BlockManager blocks_;
  std::unordered_map<int64_t, SeqPtr> live_;  // waiting + running
  std::deque<SeqPtr> waiting_;                // FCFS; preempted sequences go to the front
  std::vector<SeqPtr> running_;               // admission order (LCFS = from the back)
  std::vector<SeqPtr> pending_ignored_;
  std::vector<SeqPtr> pending_aborted_;
  std::vector<int32_t> free_slots_;           // MTP info slots 1..max_num_seqs
  StateSlotPool state_slots_;                 // state slots 1..max_num_seqs
  PrefixCacheStats prefix_stats_;
  std::unordered_set<uint64_t> swa_keys_;     // SWA snapshot keys held by the engine
  int64_t next_step_id_ = 0;
  int64_t next_arrival_ = 0;
  mutable std::mutex mu_;
};

}  // namespace deepinfer
