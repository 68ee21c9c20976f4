#include "request_output.hpp"

namespace deepinfer {

RequestOutputPool::RequestOutputPool(size_t capacity)
    : slots_(capacity), generation_(capacity, 0), live_(capacity, 0) {
  if (capacity < 1 || capacity > 0xfffffffeu) fail_value("RequestOutputPool capacity must be in [1, 2^32-2], got ", capacity);
  free_.reserve(capacity);
  for (size_t i = capacity; i-- > 0;) free_.push_back(uint32_t(i));  // pop order 0, 1, ...
}

size_t RequestOutputPool::num_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

void RequestOutputPool::allocate(size_t n, uint64_t* handles, RequestOutput** outputs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n > free_.size())
    throw std::runtime_error(str_cat("RequestOutputPool exhausted (capacity=", slots_.size(), ", free=", free_.size(),
                                     ", requested=", n, "); outputs are not being released: release each step's "
                                     "handles (or clone() what must outlive them) before the next step"));
  for (size_t k = 0; k < n; ++k) {
    uint32_t s = free_.back();
    free_.pop_back();
    live_[s] = 1;
    handles[k] = (uint64_t(generation_[s]) << 32) | (uint64_t(s) + 1);
    outputs[k] = &slots_[s];
  }
}

size_t RequestOutputPool::checked_slot(uint64_t handle) const {
  size_t s = slot_of(handle);
  if ((handle & 0xffffffffu) == 0 || s >= slots_.size() || live_[s] != 1 || generation_[s] != uint32_t(handle >> 32))
    fail_value("RequestOutputPool: handle ", handle, " is not live (released, stale, or from another pool)");
  return s;
}

void RequestOutputPool::release(const uint64_t* handles, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t k = 0;
  try {
    for (; k < n; ++k) {
      size_t s = checked_slot(handles[k]);
      live_[s] = 2;  // mark: a repeat inside this batch fails the live check
    }
  } catch (...) {
    for (size_t j = 0; j < k; ++j) live_[slot_of(handles[j])] = 1;
    throw;
  }
  for (size_t j = 0; j < n; ++j) {
    size_t s = slot_of(handles[j]);
    live_[s] = 0;
    ++generation_[s];
    free_.push_back(uint32_t(s));
  }
}

const RequestOutput& RequestOutputPool::at(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[checked_slot(handle)];
}

bool RequestOutputPool::is_live(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t s = slot_of(handle);
  return (handle & 0xffffffffu) != 0 && s < slots_.size() && live_[s] == 1 && generation_[s] == uint32_t(handle >> 32);
}

}  // namespace deepinfer
