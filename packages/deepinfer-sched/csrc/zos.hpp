// Zero-overhead scheduling (ZOS) alignment: where each request of this step sat in the previous
// step, so the device can scatter last step's sampled tokens / drafts / confidences into this
// step's rows without a CPU round trip.
//
//   previous request_ids  [7, 3, 9]          this request_ids  [3, 5, 7]
//   remap                 [1, -1, 0]         (5 is fresh: -1, confidence 0, no golden token)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer {

// remap[i] = index of request_ids[i] in prev_request_ids, or -1. Throws std::invalid_argument
// when an id repeats inside either list.
std::vector<int32_t> prepare_zos_inputs(const int64_t* prev_request_ids, size_t num_prev,
                                        const int64_t* request_ids, size_t num);

}  // namespace deepinfer
