// build_request_outputs: one RequestOutput per token pushed by process_outputs, plus one final
// output per ignored or aborted request of the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "request_output.hpp"
#include "scheduler_output.hpp"

namespace deepinfer {

struct OutputLogprobs {
  const float* token_logprobs = nullptr;     // [req_cnt] logprob of each main token; may be null
  size_t num_token_logprobs = 0;
  const float* verified_logprobs = nullptr;  // [total_q] logprob of each accepted draft at its row; may be null
  size_t num_verified_logprobs = 0;
  const int32_t* first_token_positions = nullptr;  // [req_cnt] device ftp; required when drafts are emitted
  size_t num_ftp = 0;
};

// Rules (SPEC §3):
//  * per request, accepted drafts first, then the main token: exactly pushed[i] outputs;
//  * `finished` / finish_reason only on the request's last output of the step;
//  * num_output_tokens is cumulative: output_len_before + (index in step + 1);
//  * draft_tok = rows verified (seqlen_q = drafts + 1), accept_tok = accepted drafts + 1 (tokens
//    the verification yields, seed 000's worked example: 4 and 3) on the last output of a decode
//    step only, with the confidences of the verified drafts; 0 / 0 on a prefill step's output;
//    -1 on every other output;
//  * logprobs clamped to >= -9999 (NaN and -inf too);
//  * emitting accepted drafts without first_token_positions is a hard error (LedgerError);
//  * ignored requests: token = last prompt token, num_output_tokens = output_len + 1, reason
//    "prompt_length_exceeded"; aborted: token = kNoToken, num_output_tokens = output_len, "abort".
// Returns the handles in order: scheduled requests (row-block order), ignored, aborted.
std::vector<uint64_t> build_request_outputs(const SchedulerOutput& out, const int32_t* pushed, size_t num_pushed,
                                            RequestOutputPool& pool, const OutputLogprobs& logprobs);

}  // namespace deepinfer
