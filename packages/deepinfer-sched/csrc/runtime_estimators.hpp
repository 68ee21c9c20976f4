// Online runtime estimators of a decode step (they trust what just happened, not a constant).
//
// SamplerRuntimeEstimator: median of the last `window_size` sampler times (ms).
// ForwardRuntimeEstimator: the launch curve of a CUDA graph ignores context length; fit a
//   slope_ms per row so that forward_ms ~= baseline_ms + slope_ms * graph_size. Each sample is
//   (forward_ms - baseline_ms) / graph_size; of the last `window_size` samples, take the median
//   within each graph size that has >= min_samples samples, then the median of those medians
//   (every qualifying graph size weighs the same, however often it ran).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

namespace deepinfer {

class SamplerRuntimeEstimator {
 public:
  explicit SamplerRuntimeEstimator(int32_t window_size = 64);
  void add(double sampler_ms);
  std::optional<double> estimate_ms() const;  // nullopt until the first sample
  int32_t num_samples() const { return int32_t(window_.size()); }
  int32_t window_size() const { return window_size_; }

 private:
  int32_t window_size_;
  std::deque<double> window_;
};

class ForwardRuntimeEstimator {
 public:
  explicit ForwardRuntimeEstimator(int32_t window_size = 256, int32_t min_samples = 4);
  void add(int32_t graph_size, double forward_ms, double baseline_ms);
  std::optional<double> slope_ms() const;  // nullopt until some graph size has min_samples samples
  // baseline_ms + slope_ms * graph_size (slope 0 until known).
  double estimate_ms(int32_t graph_size, double baseline_ms) const;
  int32_t num_samples() const { return int32_t(window_.size()); }

 private:
  int32_t window_size_;
  int32_t min_samples_;
  std::deque<std::pair<int32_t, double>> window_;  // (graph_size, slope sample)
};

}  // namespace deepinfer
