// StateSlotPool: the per-request state kind of the KV ledger (SPEC §5 "state KV in HBM").
//
// Block KV grows with the tokens (BlockManager: compressed entries, index keys, Engram ids);
// the window KV rings and compressor stages are fixed per running sequence: one state slot each,
// ids 1..num_slots (slot 0 = the padding requests' slot, never handed out). A slot is held by
// exactly one running sequence; taking from an empty pool and releasing a free slot (double
// free) are ledger errors.
#pragma once

#include <cstdint>
#include <vector>

#include "common.hpp"

namespace deepinfer {

class StateSlotPool {
 public:
  explicit StateSlotPool(int32_t num_slots);

  int32_t num_slots() const { return int32_t(in_use_.size()) - 1; }
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_used() const { return num_slots() - num_free(); }
  bool can_take() const { return !free_.empty(); }
  bool in_use(int32_t slot) const;
  int32_t take();              // lowest free slot last released first (LIFO), >= 1
  void release(int32_t slot);  // LedgerError unless `slot` is in use

 private:
  std::vector<uint8_t> in_use_;  // [num_slots + 1], index 0 unused
  std::vector<int32_t> free_;
};

}  // namespace deepinfer
