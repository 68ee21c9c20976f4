// DP step-type vote: every data-parallel rank must run the same kind of step (the collectives of
// a prefill and of a decode step differ). Pure functions; the engine does the allreduce.
//
//   point = prefill_attempt_point(decode_steps_since_prefill)      same on every rank
//   vote  = step_type_vote(has_prefill_work, has_decode_work)      per rank, 3 ints
//   allreduce(vote, MIN) across the DP group                       elementwise
//   kind  = decide_step_kind(min_vote, point)                      same on every rank
//
// Attempt points (counter = decode steps since the last prefill step):
//   ALL  counter == 0 or counter % all_interval == 0 (DEEPINFER_PREFILL_ATTEMPT_INTERVAL, 70):
//        prefill only if EVERY rank has prefill work (nobody runs an empty prompt step);
//   ANY  counter >= any_interval (DEEPINFER_PREFILL_ANY_ATTEMPT_INTERVAL, 100): prefill if ANY
//        rank has work (a lone rank's prompts wait at most that many decode steps);
//   NONE otherwise: decode.
// When no rank has decode work, prefill as soon as any rank has prefill work (else IDLE).
#pragma once

#include <array>
#include <cstdint>

#include "common.hpp"

namespace deepinfer {

enum class AttemptPoint : uint8_t { NONE = 0, ALL = 1, ANY = 2 };

inline constexpr int32_t kDefaultPrefillAttemptInterval = 70;
inline constexpr int32_t kDefaultPrefillAnyAttemptInterval = 100;

AttemptPoint prefill_attempt_point(int64_t decode_steps_since_prefill,
                                   int32_t all_interval = kDefaultPrefillAttemptInterval,
                                   int32_t any_interval = kDefaultPrefillAnyAttemptInterval);

// [has_prefill, !has_prefill, !has_decode] as 0/1: after an elementwise MIN, entry 0 says "every
// rank has prefill work", entry 1 "no rank has prefill work", entry 2 "no rank has decode work".
std::array<int32_t, 3> step_type_vote(bool has_prefill_work, bool has_decode_work);

StepKind decide_step_kind(const std::array<int32_t, 3>& min_vote, AttemptPoint point);

}  // namespace deepinfer
