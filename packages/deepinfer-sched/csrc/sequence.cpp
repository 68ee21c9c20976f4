#include "sequence.hpp"

namespace deepinfer {

void CacheCounters::commit_processed_tokens(int64_t request_id, int32_t rows_scheduled,
                                            int32_t rows_kept) {
  DI_LEDGER_CHECK(num_inflight_steps > 0, "request ", request_id,
                  ": commit_processed_tokens with no step in flight (num_inflight_steps == 0)");
  DI_LEDGER_CHECK(rows_kept >= 0 && rows_kept <= rows_scheduled, "request ", request_id,
                  ": commit keeps ", rows_kept, " of ", rows_scheduled, " scheduled rows");
  DI_LEDGER_CHECK(num_uncommitted_rows >= rows_scheduled, "request ", request_id,
                  ": num_uncommitted_rows (", num_uncommitted_rows, ") < rows of the committed step (",
                  rows_scheduled, ")");
  num_tokens -= rows_scheduled - rows_kept;
  num_uncommitted_rows -= rows_scheduled;
  num_inflight_steps -= 1;
}

Sequence::Sequence(int64_t request_id_, std::vector<int32_t> prompt, RequestParams params_,
                   int64_t arrival_, const std::vector<int32_t>* engram_map)
    : request_id(request_id_),
      params(std::move(params_)),
      arrival(arrival_),
      prompt_len(int32_t(prompt.size())),
      token_ids(std::move(prompt)),
      prefill_len(prompt_len) {
  if (engram_map != nullptr) {
    compressed_token_ids.reserve(token_ids.size());
    for (int32_t t : token_ids) compressed_token_ids.push_back((*engram_map)[t]);
  }
}

void Sequence::append_token_id(int32_t token, const std::vector<int32_t>* engram_map) {
  token_ids.push_back(token);
  if (engram_map != nullptr) compressed_token_ids.push_back((*engram_map)[token]);
}

int32_t Sequence::take_num_drafts(int32_t nextn) {
  int32_t d = mtp.num_drafts_next < 0 ? nextn : mtp.num_drafts_next;
  mtp.num_drafts_next = -1;
  return d;
}

void Sequence::reset_for_recompute() {
  DI_LEDGER_CHECK(block_table.empty(), "request ", request_id,
                  ": reset_for_recompute with ", block_table.size(), " blocks still held");
  DI_LEDGER_CHECK(mtp.info_slot == 0, "request ", request_id,
                  ": reset_for_recompute with MTP info slot ", mtp.info_slot, " still held");
  DI_LEDGER_CHECK(state_slot == 0, "request ", request_id, ": reset_for_recompute with state slot ", state_slot,
                  " still held");
  status = SequenceStatus::WAITING;
  prefill_len = num_tokens_total();
  epoch += 1;
  cache = CacheCounters{};
  mtp = MtpState{};
  num_hashed_blocks = 0;
  last_block_hash = 0;
  chain_hashes.clear();
  last_scheduled_step = -1;
  last_scheduled_index = -1;
}

}  // namespace deepinfer
