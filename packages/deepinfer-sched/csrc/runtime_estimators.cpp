#include "runtime_estimators.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "common.hpp"

namespace deepinfer {

namespace {
double median(std::vector<double> v) {
  size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double hi = v[mid];
  if (n % 2 == 1) return hi;
  double lo = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lo + hi);
}
}  // namespace

SamplerRuntimeEstimator::SamplerRuntimeEstimator(int32_t window_size) : window_size_(window_size) {
  if (window_size < 1) fail_value("window_size must be >= 1, got ", window_size);
}

void SamplerRuntimeEstimator::add(double ms) {
  if (!std::isfinite(ms) || ms < 0) fail_value("sampler_ms must be finite and >= 0, got ", ms);
  window_.push_back(ms);
  if (int32_t(window_.size()) > window_size_) window_.pop_front();
}

std::optional<double> SamplerRuntimeEstimator::estimate_ms() const {
  if (window_.empty()) return std::nullopt;
  return median(std::vector<double>(window_.begin(), window_.end()));
}

ForwardRuntimeEstimator::ForwardRuntimeEstimator(int32_t window_size, int32_t min_samples)
    : window_size_(window_size), min_samples_(min_samples) {
  if (window_size < 1) fail_value("window_size must be >= 1, got ", window_size);
  if (min_samples < 1) fail_value("min_samples must be >= 1, got ", min_samples);
}

void ForwardRuntimeEstimator::add(int32_t graph_size, double forward_ms, double baseline_ms) {
  if (graph_size < 1) fail_value("graph_size must be >= 1, got ", graph_size);
  if (!std::isfinite(forward_ms) || !std::isfinite(baseline_ms))
    fail_value("forward_ms and baseline_ms must be finite, got ", forward_ms, " and ", baseline_ms);
  window_.emplace_back(graph_size, (forward_ms - baseline_ms) / graph_size);
  if (int32_t(window_.size()) > window_size_) window_.pop_front();
}

std::optional<double> ForwardRuntimeEstimator::slope_ms() const {
  std::map<int32_t, std::vector<double>> by_size;
  for (const auto& [size, slope] : window_) by_size[size].push_back(slope);
  std::vector<double> medians;
  for (auto& [size, samples] : by_size)
    if (int32_t(samples.size()) >= min_samples_) medians.push_back(median(std::move(samples)));
  if (medians.empty()) return std::nullopt;
  return median(std::move(medians));
}

double ForwardRuntimeEstimator::estimate_ms(int32_t graph_size, double baseline_ms) const {
  return baseline_ms + slope_ms().value_or(0.0) * graph_size;
}

}  // namespace deepinfer
