#include "build_request_outputs.hpp"

#include <algorithm>
#include <cmath>

namespace deepinfer {

namespace {
inline float clamp_logprob(float x) { return x >= kMinLogprob ? x : kMinLogprob; }  // NaN -> floor too
}  // namespace

std::vector<uint64_t> build_request_outputs(const SchedulerOutput& out, const int32_t* pushed, size_t num_pushed,
                                            RequestOutputPool& pool, const OutputLogprobs& lp) {
  const int32_t n = out.req_cnt();
  if (!out.processed) fail_ledger("build_request_outputs: step ", out.step_id, " has not been processed");
  if (int32_t(num_pushed) != n) fail_value("pushed must have req_cnt=", n, " entries, got ", num_pushed);
  if (lp.token_logprobs && int32_t(lp.num_token_logprobs) != n)
    fail_value("token_logprobs must have req_cnt=", n, " entries, got ", lp.num_token_logprobs);
  if (lp.verified_logprobs && int32_t(lp.num_verified_logprobs) != out.total_q())
    fail_value("verified_logprobs must have total_q=", out.total_q(), " entries, got ", lp.num_verified_logprobs);
  size_t total = out.ignored_seqs.size() + out.aborted_seqs.size();
  bool emits_drafts = false;
  for (int32_t i = 0; i < n; ++i) {
    if (pushed[i] != out.pushed[i])
      fail_ledger("request ", out.request_ids[i], ": pushed[", i, "] = ", pushed[i],
                  " differs from process_outputs' pushed_tokens_before_finish ", out.pushed[i]);
    total += size_t(pushed[i]);
    emits_drafts |= pushed[i] > 0 && out.num_accepted[i] > 0;
  }
  if (emits_drafts && lp.first_token_positions == nullptr)
    fail_ledger("build_request_outputs: step ", out.step_id,
                " emits accepted draft tokens but first_token_positions was not given");
  if (lp.first_token_positions) {
    if (int32_t(lp.num_ftp) != n) fail_value("first_token_positions must have req_cnt=", n, " entries, got ", lp.num_ftp);
    for (int32_t i = 0; i < n; ++i)
      if (lp.first_token_positions[i] != out.first_token_pos[i])
        fail_ledger("request ", out.request_ids[i], ": first_token_positions[", i, "] = ", lp.first_token_positions[i],
                    " != scheduled ", out.first_token_pos[i]);
  }

  std::vector<uint64_t> handles(total);
  std::vector<RequestOutput*> slots(total);
  pool.allocate(total, handles.data(), slots.data());  // all or nothing, before any write
  size_t k = 0;
  const bool decode = out.step_kind == StepKind::DECODE;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = pushed[i];
    if (p == 0) continue;
    const Sequence& seq = *out.seqs[i];
    const int32_t start = seq.prompt_len + out.output_len_before[i];  // first token of this step
    DI_LEDGER_CHECK(start + p <= seq.num_tokens_total(), "request ", seq.request_id, ": ", p,
                    " pushed tokens but only ", seq.num_tokens_total() - start, " appended");
    const int32_t acc = out.num_accepted[i];
    for (int32_t j = 0; j < p; ++j) {
      RequestOutput& o = *slots[k++];
      o.request_id = seq.request_id;
      o.token_id = seq.token_ids[start + j];
      float logprob = 0.0f;
      if (j < acc) {
        if (lp.verified_logprobs) logprob = lp.verified_logprobs[out.first_token_pos[i] + j];
      } else if (lp.token_logprobs) {
        logprob = lp.token_logprobs[i];
      }
      o.token_logprob = clamp_logprob(logprob);
      o.num_output_tokens = out.output_len_before[i] + j + 1;
      o.prompt_len = seq.prompt_len;
      o.finished = false;
      o.finish_reason = FinishReason::NONE;
      o.stop_token_id = -1;
      o.draft_tok = o.accept_tok = -1;
      o.num_confidence = 0;
      if (j + 1 < p) continue;
      // Last output of this request in this step: finish and step statistics.
      o.finish_reason = FinishReason(out.finish_reason[i]);
      o.finished = o.finish_reason != FinishReason::NONE;
      o.stop_token_id = out.stop_token_id[i];
      o.draft_tok = decode ? out.seqlens_q[i] : 0;
      o.accept_tok = decode ? acc + 1 : 0;
      o.num_confidence = out.num_step_confidence[i];
      std::copy_n(out.step_confidence.begin() + size_t(i) * out.nextn, o.num_confidence, o.confidence.begin());
    }
  }
  for (const auto& seq : out.ignored_seqs) {
    RequestOutput& o = *slots[k++];
    o = RequestOutput{};
    o.request_id = seq->request_id;
    o.token_id = seq->last_token_id();
    o.finished = true;
    o.finish_reason = FinishReason::PROMPT_LENGTH_EXCEEDED;
    o.num_output_tokens = seq->output_len() + 1;
    o.prompt_len = seq->prompt_len;
    o.draft_tok = o.accept_tok = 0;
  }
  for (const auto& seq : out.aborted_seqs) {
    RequestOutput& o = *slots[k++];
    o = RequestOutput{};
    o.request_id = seq->request_id;
    o.token_id = kNoToken;
    o.finished = true;
    o.finish_reason = FinishReason::ABORT;
    o.num_output_tokens = seq->output_len();
    o.prompt_len = seq->prompt_len;
    o.draft_tok = o.accept_tok = 0;
  }
  return handles;
}

}  // namespace deepinfer
