// RequestOutput (one emitted token of one request) and RequestOutputPool (fixed-capacity storage
// that hands out uint64 handles).
//
// Ownership: the pool owns the storage; a handle is a lease that lasts until release(). The
// engine releases a step's handles in one batch at the start of the next step. clone() copies an
// output to the heap so it outlives its lease. Exhaustion is an error, never a fallback: it means
// handles are not being released (a lifetime bug, not a capacity problem).
//
// Handle layout: (generation << 32) | (slot + 1). The generation of a slot changes at every
// release, so a stale or double-released handle is detected instead of reading a reused slot.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common.hpp"

namespace deepinfer {

struct RequestOutput {
  int64_t request_id = -1;
  int32_t token_id = kNoToken;   // kNoToken only on an abort's final output
  float token_logprob = 0.0f;    // clamped to >= kMinLogprob; 0.0 when the engine gave none
  bool finished = false;         // only on the last output of a step
  FinishReason finish_reason = FinishReason::NONE;
  int32_t stop_token_id = -1;    // the token that finished it with reason "stop", else -1
  int32_t num_output_tokens = 0; // cumulative output length including this token
  int32_t prompt_len = 0;
  int32_t draft_tok = -1;        // step stats, last output of a step only (else -1); see build
  int32_t accept_tok = -1;
  int32_t num_confidence = 0;    // valid entries of `confidence` (last output of a decode step)
  std::array<float, kMaxNextn> confidence{};
};

class RequestOutputPool {
 public:
  static constexpr size_t kDefaultCapacity = 10000;
  explicit RequestOutputPool(size_t capacity = kDefaultCapacity);

  size_t capacity() const { return slots_.size(); }
  size_t num_free() const;
  size_t num_in_use() const { return capacity() - num_free(); }

  // Leases n slots at once (all or nothing); throws std::runtime_error when exhausted. The
  // leased outputs hold stale contents: the caller writes every field.
  void allocate(size_t n, uint64_t* handles, RequestOutput** outputs);
  // Returns leases; throws std::invalid_argument (and releases nothing) on a stale, foreign or
  // repeated handle.
  void release(const uint64_t* handles, size_t n);
  // The output behind a live handle; throws std::invalid_argument on a stale handle.
  const RequestOutput& at(uint64_t handle) const;
  bool is_live(uint64_t handle) const;
  // Calls fn(i, output) for each live handle under one lock; throws on a stale handle.
  template <typename F>
  void for_each(const uint64_t* handles, size_t n, F&& fn) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; ++i) fn(i, slots_[checked_slot(handles[i])]);
  }
  static size_t slot_of(uint64_t handle) { return size_t(handle & 0xffffffffu) - 1; }

 private:
  size_t checked_slot(uint64_t handle) const;  // caller holds mu_

  std::vector<RequestOutput> slots_;
  std::vector<uint32_t> generation_;
  std::vector<uint8_t> live_;
  std::vector<uint32_t> free_;  // stack of free slots
  mutable std::mutex mu_;
};

}  // namespace deepinfer
