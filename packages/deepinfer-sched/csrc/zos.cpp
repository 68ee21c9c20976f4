#include "zos.hpp"

#include <unordered_map>

#include "common.hpp"

namespace deepinfer {

std::vector<int32_t> prepare_zos_inputs(const int64_t* prev, size_t num_prev, const int64_t* ids, size_t num) {
  std::unordered_map<int64_t, int32_t> index;
  index.reserve(num_prev * 2);
  for (size_t i = 0; i < num_prev; ++i)
    if (!index.emplace(prev[i], int32_t(i)).second)
      fail_value("prev_request_ids repeats request ", prev[i]);
  std::unordered_map<int64_t, int32_t> seen;
  seen.reserve(num * 2);
  std::vector<int32_t> remap(num, -1);
  for (size_t i = 0; i < num; ++i) {
    if (!seen.emplace(ids[i], int32_t(i)).second) fail_value("request_ids repeats request ", ids[i]);
    auto it = index.find(ids[i]);
    if (it != index.end()) remap[i] = it->second;
  }
  return remap;
}

}  // namespace deepinfer
