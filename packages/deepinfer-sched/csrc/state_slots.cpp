#include "state_slots.hpp"

namespace deepinfer {

StateSlotPool::StateSlotPool(int32_t num_slots) : in_use_(size_t(num_slots < 0 ? 0 : num_slots) + 1, 0) {
  if (num_slots < 0) fail_value("num_slots must be >= 0, got ", num_slots);
  free_.reserve(num_slots);
  for (int32_t s = num_slots; s >= 1; --s) free_.push_back(s);  // pop order 1, 2, ...
}

bool StateSlotPool::in_use(int32_t slot) const {
  return slot >= 1 && slot <= num_slots() && in_use_[slot];
}

int32_t StateSlotPool::take() {
  DI_LEDGER_CHECK(!free_.empty(), "StateSlotPool: no free state slot (", num_slots(),
                  " held); callers must check can_take first");
  int32_t s = free_.back();
  free_.pop_back();
  DI_LEDGER_CHECK(!in_use_[s], "StateSlotPool: free slot ", s, " is marked in use");
  in_use_[s] = 1;
  return s;
}

void StateSlotPool::release(int32_t slot) {
  DI_LEDGER_CHECK(in_use(slot), "StateSlotPool.release: slot ", slot, " is not in use (double free)");
  in_use_[slot] = 0;
  free_.push_back(slot);
}

}  // namespace deepinfer
