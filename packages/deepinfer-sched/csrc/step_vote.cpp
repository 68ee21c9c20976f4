#include "step_vote.hpp"

namespace deepinfer {

AttemptPoint prefill_attempt_point(int64_t counter, int32_t all_interval, int32_t any_interval) {
  if (counter < 0) fail_value("decode_steps_since_prefill must be >= 0, got ", counter);
  if (all_interval < 1) fail_value("all_interval must be >= 1, got ", all_interval);
  if (any_interval < 1) fail_value("any_interval must be >= 1, got ", any_interval);
  if (counter >= any_interval) return AttemptPoint::ANY;
  if (counter % all_interval == 0) return AttemptPoint::ALL;
  return AttemptPoint::NONE;
}

std::array<int32_t, 3> step_type_vote(bool has_prefill, bool has_decode) {
  return {has_prefill ? 1 : 0, has_prefill ? 0 : 1, has_decode ? 0 : 1};
}

StepKind decide_step_kind(const std::array<int32_t, 3>& v, AttemptPoint point) {
  for (int32_t x : v)
    if (x != 0 && x != 1) fail_value("min_vote entries must be 0 or 1, got ", x);
  const bool all_prefill = v[0] == 1, any_prefill = v[1] == 0, no_decode = v[2] == 1;
  if (all_prefill && !any_prefill) fail_value("min_vote is inconsistent: every rank and no rank has prefill work");
  if (!any_prefill) return no_decode ? StepKind::IDLE : StepKind::DECODE;
  if (no_decode) return StepKind::PREFILL;
  switch (point) {
    case AttemptPoint::ALL: return all_prefill ? StepKind::PREFILL : StepKind::DECODE;
    case AttemptPoint::ANY: return StepKind::PREFILL;
    default: return StepKind::DECODE;
  }
}

}  // namespace deepinfer
