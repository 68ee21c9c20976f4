// Shared vocabulary of the ledger: protocol constants, enums and the error helpers.
//
// Style note: invariants of the ledger fail loudly. A violated invariant throws LedgerError
// (Python: deepinfer_sched.LedgerError, a RuntimeError) naming the request and the counter;
// a bad argument throws std::invalid_argument (Python: ValueError) naming the field. Nothing
// is silently repaired.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace deepinfer {

// Terminator of the accepted-draft prefix in verified_token_ids [total_q]. Readers stop at the
// first kVerifiedEnd (a terminator, not a filter). Python: deepinfer_sched.VERIFIED_END.
inline constexpr int32_t kVerifiedEnd = -1;
// token_id of an output that carries no token (the final output of an aborted request).
inline constexpr int32_t kNoToken = -1;
// Logprobs leave the engine clamped to this finite floor (never -inf or NaN in an output).
inline constexpr float kMinLogprob = -9999.0f;
// Upper bound of nextn (draft rows per step); RequestOutput stores confidences inline.
inline constexpr int32_t kMaxNextn = 16;

enum class StepKind : uint8_t { IDLE = 0, PREFILL = 1, DECODE = 2 };

enum class SequenceStatus : uint8_t {
  WAITING = 0,
  RUNNING = 1,
  FINISHED_STOPPED = 2,  // EOS or a stop token id
  FINISHED_LENGTH = 3,   // max_tokens or max_model_len
  FINISHED_ABORTED = 4,
  FINISHED_IGNORED = 5,  // prompt longer than max_model_len: never scheduled
};

// Wire value of RequestOutput.finish_reason (gather() column "finish_reason", int8).
enum class FinishReason : uint8_t { NONE = 0, STOP = 1, LENGTH = 2, ABORT = 3, PROMPT_LENGTH_EXCEEDED = 4 };

inline bool is_finished(SequenceStatus s) { return s >= SequenceStatus::FINISHED_STOPPED; }

inline FinishReason finish_reason_of(SequenceStatus s) {
  switch (s) {
    case SequenceStatus::FINISHED_STOPPED: return FinishReason::STOP;
    case SequenceStatus::FINISHED_LENGTH: return FinishReason::LENGTH;
    case SequenceStatus::FINISHED_ABORTED: return FinishReason::ABORT;
    case SequenceStatus::FINISHED_IGNORED: return FinishReason::PROMPT_LENGTH_EXCEEDED;
    default: return FinishReason::NONE;
  }
}

inline const char* finish_reason_str(FinishReason r) {
  switch (r) {
    case FinishReason::STOP: return "stop";
    case FinishReason::LENGTH: return "length";
    case FinishReason::ABORT: return "abort";
    case FinishReason::PROMPT_LENGTH_EXCEEDED: return "prompt_length_exceeded";
    default: return nullptr;
  }
}

// A broken ledger invariant (a bug in the caller or in the scheduler, never a user input).
class LedgerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail_ledger(Args&&... args) {
  throw LedgerError(str_cat(std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_value(Args&&... args) {
  throw std::invalid_argument(str_cat(std::forward<Args>(args)...));
}

#define DI_LEDGER_CHECK(cond, ...)                   \
  do {                                               \
    if (!(cond)) ::deepinfer::fail_ledger(__VA_ARGS__); \
  } while (0)

}  // namespace deepinfer
