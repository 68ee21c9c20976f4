// Scheduler::process_outputs: commit one step's samples into the sequences (the C++ ledger).
//
// For each request: append the accepted draft prefix (up to the first kVerifiedEnd) then the
// main token, running the stop check after every token and stopping at a finish; record
// pushed_tokens_before_finish[i]. Already finished (stopped or aborted) sequences and sequences
// preempted while the step was in flight (older epoch) push 0 and touch no counter.
// The whole input is validated before any sequence changes (a bad step leaves no trace).
#include <algorithm>

#include "scheduler.hpp"

namespace deepinfer {

void Scheduler::check_stop(Sequence& seq, int32_t token) const {
  const int32_t out_len = seq.output_len();
  if (out_len >= seq.params.min_tokens) {
    bool eos = !seq.params.ignore_eos &&
               std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), token) != config_.eos_token_ids.end();
    bool stop_id = std::find(seq.params.stop_token_ids.begin(), seq.params.stop_token_ids.end(), token) !=
                   seq.params.stop_token_ids.end();
    if (eos || stop_id) {
      seq.status = SequenceStatus::FINISHED_STOPPED;
      seq.stop_token_id = token;
      return;
    }
  }
  if (out_len >= seq.params.max_tokens || seq.num_tokens_total() >= config_.max_model_len)
    seq.status = SequenceStatus::FINISHED_LENGTH;
}

namespace {

// Accepted drafts of request i: the rows before the first kVerifiedEnd. Validates checkpoint 2
// (a contiguous prefix, then only terminators; the final row is always a terminator).
int32_t count_accepted(const SchedulerOutput& out, int32_t i, const int32_t* verified,
                       const std::vector<int32_t>* map) {
  if (verified == nullptr) return 0;
  const int32_t base = out.first_token_pos[i], rows = out.seqlens_q[i];
  const int64_t rid = out.request_ids[i];
  int32_t k = 0;
  bool ended = false;
  for (int32_t j = 0; j < rows; ++j) {
    int32_t v = verified[base + j];
    if (v == kVerifiedEnd) {
      ended = true;
      continue;
    }
    if (ended || j == rows - 1)
      fail_ledger("request ", rid, ": verified_token_ids[", base + j, "] = ", v,
                  ended ? " after the -1 terminator (accepted prefix must be contiguous)"
                        : " on the final row (the final row is fresh-sampled, never verified)");
    if (out.step_kind != StepKind::DECODE)
      fail_ledger("request ", rid, ": verified_token_ids[", base + j, "] = ", v, " in a prefill step");
    if (v < 0) fail_ledger("request ", rid, ": verified_token_ids[", base + j, "] = ", v, " is negative");
    if (map && size_t(v) >= map->size())
      fail_ledger("request ", rid, ": accepted token ", v, " outside engram_vocab_map (size ", map->size(), ")");
    ++k;
  }
  return k;
}

}  // namespace

// SWA tier: the latest multiple P of swa_snapshot_tokens the committed KV rows crossed in this step
// (committed_before < P <= committed), with the chain hash of the prefix [0, P) (the key a later
// admission looks its snapshot up by). The device took the window at P when it ran the step.
void Scheduler::record_swa_point(SchedulerOutput& out, int32_t i, const Sequence& seq,
                                 int32_t committed_before) const {
  const int32_t a = config_.swa_snapshot_tokens, bs = config_.block_size;
  if (a == 0) return;
  const int32_t committed = std::min(seq.cache.num_committed_tokens(), seq.num_tokens_total());
  const int32_t point = committed / a * a;
  if (point <= committed_before || point / bs > int32_t(seq.chain_hashes.size())) return;
  out.swa_points[i] = point;
  out.swa_keys[i] = seq.chain_hashes[point / bs - 1];
}

std::vector<int32_t> Scheduler::process_outputs(SchedulerOutput& out, const SampledInfo& in) {
  const int32_t n = out.req_cnt();
  const bool decode = out.step_kind == StepKind::DECODE;
  if (out.processed) fail_ledger("process_outputs: step ", out.step_id, " was already processed");
  if (int32_t(in.num_token_ids) != n)
    fail_value("token_ids must have req_cnt=", n, " entries, got ", in.num_token_ids);
  if (in.verified_token_ids && int32_t(in.num_verified) != out.total_q())
    fail_value("verified_token_ids must have total_q=", out.total_q(), " entries, got ", in.num_verified);
  if (in.confidence && (int32_t(in.confidence_rows) != n || int32_t(in.confidence_cols) != out.nextn))
    fail_value("confidence must have shape [req_cnt=", n, ", nextn=", out.nextn, "], got [", in.confidence_rows,
               ", ", in.confidence_cols, "]");
  if (in.first_token_positions) {
    if (int32_t(in.num_ftp) != n) fail_value("first_token_positions must have req_cnt=", n, " entries, got ", in.num_ftp);
    for (int32_t i = 0; i < n; ++i)
      if (in.first_token_positions[i] != out.first_token_pos[i])
        fail_ledger("request ", out.request_ids[i], ": device first_token_positions[", i, "] = ",
                    in.first_token_positions[i], " != scheduled ", out.first_token_pos[i]);
  }
  const auto* map = engram_map();

  // Pass 1: validate everything.
  std::vector<int32_t>& accepted = out.num_accepted;
  accepted.assign(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    accepted[i] = count_accepted(out, i, in.verified_token_ids, map);
    const Sequence& seq = *out.seqs[i];
    bool samples = decode || out.is_last_chunk[i];
    bool live = !seq.is_finished() && seq.epoch == out.epochs[i];
    if (samples && live) {
      int32_t t = in.token_ids[i];
      if (t < 0) fail_ledger("request ", seq.request_id, ": main token_ids[", i, "] = ", t, " is negative");
      if (map && size_t(t) >= map->size())
        fail_ledger("request ", seq.request_id, ": main token ", t, " outside engram_vocab_map (size ", map->size(), ")");
    }
  }

  // Pass 2: commit.
  out.pushed.assign(n, 0);
  out.output_len_before.assign(n, 0);
  out.kept_rows.assign(n, 0);
  out.finish_reason.assign(n, uint8_t(FinishReason::NONE));
  out.stop_token_id.assign(n, -1);
  out.step_confidence.assign(size_t(n) * out.nextn, 0.0f);
  out.num_step_confidence.assign(n, 0);
  out.swa_points.assign(n, 0);
  out.swa_keys.assign(n, 0);
  bool any_finished = false;
  for (int32_t i = 0; i < n; ++i) {
    Sequence& seq = *out.seqs[i];
    out.output_len_before[i] = seq.output_len();
    if (seq.is_finished() || seq.epoch != out.epochs[i]) continue;  // aborted/stopped, or preempted in flight
    const int32_t committed_before = seq.cache.num_committed_tokens();
    const int32_t rows = out.seqlens_q[i], base = out.first_token_pos[i];
    int32_t pushed = 0;
    if (decode || out.is_last_chunk[i]) {
      const int32_t main = in.token_ids[i];
      for (int32_t j = 0; j <= accepted[i]; ++j) {
        int32_t tok = j < accepted[i] ? in.verified_token_ids[base + j] : main;
        seq.append_token_id(tok, map);
        ++pushed;
        check_stop(seq, tok);
        if (seq.is_finished()) break;
      }
      seq.mtp.last_output_token = main;
      if (decode) {  // confidences of the drafts verified now, predicted one step earlier
        int32_t m = std::min<int32_t>(rows - 1, int32_t(seq.mtp.prev_confidence.size()));
        std::copy_n(seq.mtp.prev_confidence.begin(), m, out.step_confidence.begin() + size_t(i) * out.nextn);
        out.num_step_confidence[i] = m;
      }
      if (in.confidence)
        seq.mtp.prev_confidence.assign(in.confidence + size_t(i) * out.nextn, in.confidence + size_t(i + 1) * out.nextn);
      else
        seq.mtp.prev_confidence.clear();
    }
    // KV commit: a prefill chunk keeps all its rows; a decode step keeps the appended tokens.
    out.kept_rows[i] = decode ? pushed : rows;
    seq.cache.commit_processed_tokens(seq.request_id, rows, out.kept_rows[i]);
    out.pushed[i] = pushed;
    if (seq.is_finished()) {
      out.finish_reason[i] = uint8_t(finish_reason_of(seq.status));
      out.stop_token_id[i] = seq.stop_token_id;
      blocks_.cache_full_blocks(seq.block_table, seq.token_ids.data(),
                                std::min(seq.cache.num_committed_tokens(), seq.num_tokens_total()),
                                seq.num_hashed_blocks, seq.last_block_hash, &seq.chain_hashes);
      record_swa_point(out, i, seq, committed_before);
      release_resources(seq);
      live_.erase(seq.request_id);
      any_finished = true;
      continue;
    }
    const int32_t committed = seq.cache.num_committed_tokens();
    if (seq.needs_prefill() || committed < seq.prefill_len) {
      DI_LEDGER_CHECK(committed <= seq.prefill_len && pushed == 0, "request ", seq.request_id,
                      ": prefill commit left committed tokens ", committed, " (prefill_len ", seq.prefill_len, ")");
    } else {
      DI_LEDGER_CHECK(committed == seq.num_tokens_total() - 1, "request ", seq.request_id, ": committed KV rows (",
                      committed, ") != len(token_ids) - 1 (", seq.num_tokens_total() - 1, ") after step ", out.step_id);
    }
    blocks_.cache_full_blocks(seq.block_table, seq.token_ids.data(), committed, seq.num_hashed_blocks,
                              seq.last_block_hash, &seq.chain_hashes);
    record_swa_point(out, i, seq, committed_before);
  }
  if (any_finished)
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](const SeqPtr& s) { return s->is_finished(); }),
                   running_.end());
  out.processed = true;
  check_slot_invariant("process_outputs()");
  return out.pushed;
}

}  // namespace deepinfer
