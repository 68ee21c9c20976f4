// Scheduler: requests in, one SchedulerOutput per step out. See scheduler.hpp for the policy.
#include "scheduler.hpp"

#include <algorithm>

namespace deepinfer {

Scheduler::Scheduler(SchedulerConfig config)
    : config_((config.validate(), std::move(config))),
      blocks_(config_.num_blocks, config_.block_size, config_.enable_prefix_caching),
      state_slots_(config_.max_num_seqs) {
  if (config_.nextn > 0) {
    free_slots_.reserve(config_.max_num_seqs);
    for (int32_t s = config_.max_num_seqs; s >= 1; --s) free_slots_.push_back(s);  // slot 0 = padding
  }
}

void Scheduler::add_request(int64_t request_id, std::vector<int32_t> prompt, RequestParams params) {
  params.validate();
  if (prompt.empty()) fail_value("prompt_token_ids of request ", request_id, " must not be empty");
  const auto* map = engram_map();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0)
      fail_value("prompt_token_ids[", i, "] of request ", request_id, " must be >= 0, got ", prompt[i]);
    if (map && size_t(prompt[i]) >= map->size())
      fail_value("prompt_token_ids[", i, "] of request ", request_id, " = ", prompt[i],
                 " is outside engram_vocab_map (size ", map->size(), ")");
  }
  if (live_.count(request_id)) fail_value("request_id ", request_id, " is already in the scheduler");
  auto seq = std::make_shared<Sequence>(request_id, std::move(prompt), std::move(params), next_arrival_++, map);
  if (seq->prompt_len > config_.max_model_len) {
    seq->status = SequenceStatus::FINISHED_IGNORED;  // reported by the next schedule(), never scheduled
    pending_ignored_.push_back(std::move(seq));
    return;
  }
  live_.emplace(request_id, seq);
  waiting_.push_back(std::move(seq));
}

bool Scheduler::abort_request(int64_t request_id) {
  auto it = live_.find(request_id);
  if (it == live_.end()) return false;
  SeqPtr seq = it->second;
  if (seq->status == SequenceStatus::WAITING) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  } else {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  }
  release_resources(*seq);
  seq->status = SequenceStatus::FINISHED_ABORTED;
  live_.erase(it);
  pending_aborted_.push_back(std::move(seq));
  return true;
}

void Scheduler::set_num_drafts(const int64_t* ids, const int32_t* drafts, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (drafts[i] < 0 || drafts[i] > config_.nextn)
      fail_value("num_drafts[", i, "] (request ", ids[i], ") must be in [0, nextn=", config_.nextn, "], got ", drafts[i]);
  for (size_t i = 0; i < n; ++i) {
    auto it = live_.find(ids[i]);
    if (it != live_.end()) it->second->mtp.num_drafts_next = drafts[i];  // finished ones: nothing to do
  }
}

bool Scheduler::has_unfinished() const {
  return !live_.empty() || !pending_ignored_.empty() || !pending_aborted_.empty();
}

bool Scheduler::has_prefill_work() const {
  if (!waiting_.empty()) return true;
  for (const auto& s : running_)
    if (s->needs_prefill()) return true;
  return false;
}

bool Scheduler::has_decode_work() const {
  for (const auto& s : running_)
    if (!s->needs_prefill()) return true;
  return false;
}

std::shared_ptr<Sequence> Scheduler::snapshot(int64_t request_id) const {
  auto it = live_.find(request_id);
  return it == live_.end() ? nullptr : std::make_shared<Sequence>(*it->second);
}

// ---------------------------------------------------------------------------------------------
// MTP info slots

void Scheduler::allocate_mtp_slot(Sequence& seq) {
  if (config_.nextn == 0 || seq.mtp.info_slot != 0) return;
  DI_LEDGER_CHECK(!free_slots_.empty(), "no free MTP info slot for request ", seq.request_id,
                  " (running=", running_.size(), ", max_num_seqs=", config_.max_num_seqs, ")");
  seq.mtp.info_slot = free_slots_.back();
  free_slots_.pop_back();
}

void Scheduler::release_mtp_slot(Sequence& seq) {
  if (seq.mtp.info_slot == 0) return;
  free_slots_.push_back(seq.mtp.info_slot);
  seq.mtp.info_slot = 0;
}

void Scheduler::release_resources(Sequence& seq) {
  blocks_.free(seq.block_table);
  release_mtp_slot(seq);
  if (seq.state_slot != 0) {
    state_slots_.release(seq.state_slot);
    seq.state_slot = 0;
  }
}

void Scheduler::check_slot_invariant(const char* where) const {
  int32_t expected = config_.nextn > 0 ? int32_t(running_.size()) : 0;
  DI_LEDGER_CHECK(num_used_mtp_slots() == expected, where, ": used MTP info slots (", num_used_mtp_slots(),
                  ") != running sequences (", running_.size(), ")");
  DI_LEDGER_CHECK(num_used_state_slots() == int32_t(running_.size()), where, ": used state slots (",
                  num_used_state_slots(), ") != running sequences (", running_.size(), ")");
}

// ---------------------------------------------------------------------------------------------
// SWA tier hit policy (SPEC §5, prefix_stats.hpp): with rings a hit restores the window from a
// snapshot, so it stops at a multiple of A = swa_snapshot_tokens that has one:
//
//   block hit |=========================|...          (blocks; YOCO-capped)
//   L1        |====================|                  rounded down to A: snapshot at L1 -> hit L1
//   L1 - A    |==========|                            else snapshot at L1 - A -> hit L1 - A (replay A)
//                                                     else no hit (NO_SWA_SNAPSHOT)

PrefixHit Scheduler::apply_swa_policy(const Sequence& seq, PrefixHit hit, PrefixMiss& reason,
                                      uint64_t& key) const {
  const int32_t a = config_.swa_snapshot_tokens, bs = config_.block_size;
  if (a == 0 || hit.blocks.empty()) return hit;
  const int32_t l1 = hit.num_tokens(bs) / a * a;
  auto covered = [&](int32_t point) {
    return point > 0 && swa_keys_.count(blocks_.block_hash(hit.blocks[point / bs - 1])) > 0;
  };
  int32_t point = 0;
  if (covered(l1)) {
    point = l1;
  } else if (covered(l1 - a)) {
    point = l1 - a;
    reason = PrefixMiss::SWA_REPLAY;
  } else {
    reason = PrefixMiss::NO_SWA_SNAPSHOT;
  }
  key = point > 0 ? blocks_.block_hash(hit.blocks[point / bs - 1]) : 0;
  if (point == hit.num_tokens(bs)) return hit;
  return blocks_.match_prefix(seq.token_ids.data(), point / bs);
}

// ---------------------------------------------------------------------------------------------
// Prefill

int32_t Scheduler::final_chunk_tokens(int32_t prefill_len) const {
  return std::max(1, std::min(config_.min_final_chunk_tokens, prefill_len));
}

// Chunk for `seq` under `budget` rows; 0 = cannot run this step. Keeps the invariant
// remaining >= final_chunk_tokens at every chunk boundary (YOCO):
//
//   prompt  |==== chunk 1 ====|== chunk 2 (shortened) ==|===== last chunk >= R =====|
//                                                        ^ prefill_len - R
int32_t Scheduler::prefill_chunk_len(const Sequence& seq, int32_t budget) const {
  int32_t remaining = seq.prefill_len - seq.cache.num_tokens;
  int32_t r = final_chunk_tokens(seq.prefill_len);
  DI_LEDGER_CHECK(remaining >= r, "request ", seq.request_id, ": remaining prefill (", remaining,
                  ") < final chunk tokens (", r, ")");
  if (remaining <= budget) return remaining;
  int32_t chunk = budget;
  if (remaining - chunk < r) chunk = remaining - r;
  return std::max(chunk, 0);
}

bool Scheduler::schedule_prefill(SchedulerOutput& out) {
  int32_t budget = config_.max_num_batched_tokens;
  // 1. Continue chunked prefills in admission order.
  for (auto& seq : running_) {
    if (budget == 0) break;
    if (!seq->needs_prefill()) continue;
    int32_t chunk = prefill_chunk_len(*seq, budget);
    if (chunk == 0) continue;
    add_rows(out, seq, chunk, seq->cache.num_tokens + chunk == seq->prefill_len, false);
    budget -= chunk;
  }
  // 2. Admit waiting sequences FCFS (no skipping ahead: a blocked head blocks the queue).
  const int32_t bs = config_.block_size;
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < config_.max_num_seqs) {
    SeqPtr seq = waiting_.front();
    int32_t max_hit_blocks = (seq->prefill_len - final_chunk_tokens(seq->prefill_len)) / bs;
    // match every full block, so a hit shortened by the YOCO cap is told apart from a miss
    PrefixHit hit = blocks_.match_prefix(seq->token_ids.data(), seq->prefill_len / bs);
    const int32_t matched_blocks = int32_t(hit.blocks.size());
    if (matched_blocks > max_hit_blocks) hit = blocks_.match_prefix(seq->token_ids.data(), max_hit_blocks);
    PrefixMiss reason = classify_prefix_hit(blocks_.prefix_caching(), matched_blocks, max_hit_blocks);
    uint64_t restore_key = 0;
    hit = apply_swa_policy(*seq, std::move(hit), reason, restore_key);
    if (!blocks_.can_allocate(hit, seq->prefill_len)) break;
    int32_t hit_tokens = hit.num_tokens(bs);
    seq->cache.num_tokens = seq->cache.previous_num_tokens = hit_tokens;  // check before acting
    int32_t chunk = prefill_chunk_len(*seq, budget);
    if (chunk == 0) {
      seq->cache.num_tokens = seq->cache.previous_num_tokens = 0;
      break;
    }
    blocks_.allocate(seq->block_table, hit, seq->prefill_len);
    seq->num_hashed_blocks = int32_t(hit.blocks.size());
    seq->last_block_hash = hit.last_hash;
    seq->chain_hashes.clear();
    for (int32_t b : hit.blocks) seq->chain_hashes.push_back(blocks_.block_hash(b));
    seq->num_cached_tokens = hit_tokens;
    seq->prefix_miss = reason;
    prefix_stats_.record(seq->prefix_miss, seq->prefill_len, hit_tokens);
    waiting_.pop_front();
    seq->status = SequenceStatus::RUNNING;
    running_.push_back(seq);
    allocate_mtp_slot(*seq);
    DI_LEDGER_CHECK(seq->state_slot == 0, "request ", seq->request_id, ": admitted holding state slot ", seq->state_slot);
    seq->state_slot = state_slots_.take();  // running < max_num_seqs: one is free
    add_rows(out, seq, chunk, seq->cache.num_tokens + chunk == seq->prefill_len, false);
    if (config_.swa_snapshot_tokens > 0 && hit_tokens > 0) {  // the device restores the window at the hit
      out.restore_tokens.back() = hit_tokens;
      out.restore_keys.back() = restore_key;
    }
    budget -= chunk;
  }
  return !out.request_ids.empty();
}

// ---------------------------------------------------------------------------------------------
// Decode

// Frees the victim and queues it for recompute. It stays in running_ (status WAITING) until the
// caller compacts running_, so pointers into running_ stay valid during the decode loop.
void Scheduler::preempt(const SeqPtr& seq, SchedulerOutput& out) {
  release_resources(*seq);
  seq->reset_for_recompute();
  waiting_.push_front(seq);
  out.preempted_request_ids.push_back(seq->request_id);
}

bool Scheduler::schedule_decode(SchedulerOutput& out) {
  int32_t budget = config_.max_num_batched_tokens;
  bool any_preempted = false;
  for (auto it = running_.rbegin(); it != running_.rend() && budget > 0; ++it) {  // LCFS
    const SeqPtr& seq = *it;
    if (seq->status != SequenceStatus::RUNNING || seq->needs_prefill()) continue;
    int32_t rows = std::min(1 + seq->take_num_drafts(config_.nextn), budget);
    int64_t need_tokens = int64_t(seq->cache.num_tokens) + rows;
    while (!blocks_.can_append(seq->block_table, need_tokens)) {
      // Victim: shortest output among running sequences not scheduled in this step; ties go to
      // the latest admitted. The candidate itself is eligible, so a victim always exists.
      const SeqPtr* victim = nullptr;
      for (auto v = running_.rbegin(); v != running_.rend(); ++v) {
        if ((*v)->status != SequenceStatus::RUNNING || (*v)->last_scheduled_step == out.step_id) continue;
        if (!victim || (*v)->output_len() < (*victim)->output_len()) victim = &*v;
      }
      DI_LEDGER_CHECK(victim != nullptr, "request ", seq->request_id, ": no preemption victim");
      preempt(*victim, out);
      any_preempted = true;
      if (victim->get() == seq.get()) break;
    }
    if (seq->status != SequenceStatus::RUNNING) continue;
    blocks_.append(seq->block_table, need_tokens);
    add_rows(out, seq, rows, true, true);
    budget -= rows;
  }
  if (any_preempted)
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const SeqPtr& s) { return s->status != SequenceStatus::RUNNING; }),
                   running_.end());
  return !out.request_ids.empty();
}

// ---------------------------------------------------------------------------------------------
// Rows

void Scheduler::add_rows(SchedulerOutput& out, const SeqPtr& seq_ptr, int32_t rows, bool is_last_chunk,
                         bool is_decode) {
  Sequence& seq = *seq_ptr;
  const int32_t bs = config_.block_size;
  const int32_t start = seq.cache.num_tokens;
  const int32_t index = out.req_cnt();
  out.request_ids.push_back(seq.request_id);
  out.seqlens_q.push_back(rows);
  out.first_token_pos.push_back(out.total_q());
  out.num_computed_tokens.push_back(start);
  out.context_lens.push_back(start + rows);
  out.prompt_lens.push_back(seq.prompt_len);
  out.is_last_chunk.push_back(is_last_chunk ? 1 : 0);
  out.mtp_slots.push_back(seq.mtp.info_slot);
  out.state_slots.push_back(seq.state_slot);
  out.restore_tokens.push_back(0);
  out.restore_keys.push_back(0);
  out.remap.push_back(seq.last_scheduled_step == out.step_id - 1 ? seq.last_scheduled_index : -1);
  out.num_uncommitted_rows.push_back(seq.cache.num_uncommitted_rows);
  out.seqs.push_back(seq_ptr);
  out.epochs.push_back(seq.epoch);
  out.max_blocks = std::max<int32_t>(out.max_blocks, int32_t(seq.block_table.size()));

  const auto* map = engram_map();
  if (is_decode) {
    // Row 0: the golden token. Known on the CPU only when every earlier step is processed;
    // under ZOS it is last step's sample, which the device scatters in through remap.
    int32_t golden = -1;
    if (seq.cache.num_uncommitted_rows == 0) {
      DI_LEDGER_CHECK(start == seq.num_tokens_total() - 1, "request ", seq.request_id, ": decode with num_tokens (",
                      start, ") != len(token_ids) - 1 (", seq.num_tokens_total() - 1, ")");
      golden = seq.last_token_id();
    }
    for (int32_t j = 0; j < rows; ++j) {
      int32_t tok = j == 0 ? golden : -1;  // drafts come from the MTP info pool
      out.input_token_ids.push_back(tok);
      if (map) out.input_engram_ids.push_back(tok >= 0 ? (*map)[tok] : -1);
    }
  } else {
    DI_LEDGER_CHECK(start + rows <= seq.num_tokens_total(), "request ", seq.request_id,
                    ": prefill rows beyond known tokens");
    out.input_token_ids.insert(out.input_token_ids.end(), seq.token_ids.begin() + start,
                               seq.token_ids.begin() + start + rows);
    if (map)
      out.input_engram_ids.insert(out.input_engram_ids.end(), seq.compressed_token_ids.begin() + start,
                                  seq.compressed_token_ids.begin() + start + rows);
  }
  DI_LEDGER_CHECK(blocks_.blocks_for(int64_t(start) + rows) <= int32_t(seq.block_table.size()), "request ",
                  seq.request_id, ": block table (", seq.block_table.size(), " blocks) does not cover ",
                  start + rows, " tokens");
  for (int32_t j = 0; j < rows; ++j) {
    int32_t pos = start + j;
    out.positions.push_back(pos);
    out.slot_mapping.push_back(int64_t(seq.block_table[pos / bs]) * bs + pos % bs);
  }
  seq.cache.advance_optimistically(rows);
  seq.last_scheduled_step = out.step_id;
  seq.last_scheduled_index = index;
}

void Scheduler::reserve(SchedulerOutput& out) const {
  const size_t reqs = std::min<size_t>(running_.size() + waiting_.size(), size_t(config_.max_num_seqs));
  const size_t rows = std::min<size_t>(size_t(config_.max_num_batched_tokens), reqs * size_t(config_.nextn + 1) +
                                                                                 size_t(config_.max_num_batched_tokens));
  out.restore_keys.reserve(reqs);
  for (auto* v : {&out.seqlens_q, &out.first_token_pos, &out.num_computed_tokens, &out.context_lens, &out.prompt_lens,
                  &out.mtp_slots, &out.state_slots, &out.restore_tokens, &out.remap,
                  &out.num_uncommitted_rows, &out.epochs})
    v->reserve(reqs);
  out.request_ids.reserve(reqs);
  out.is_last_chunk.reserve(reqs);
  out.seqs.reserve(reqs);
  out.positions.reserve(rows);
  out.input_token_ids.reserve(rows);
  out.slot_mapping.reserve(rows);
  if (config_.has_engram_map()) out.input_engram_ids.reserve(rows);
}

void Scheduler::finalize(SchedulerOutput& out) const {
  const int32_t n = out.req_cnt(), w = out.max_blocks;
  out.block_tables.assign(size_t(n) * w, -1);
  for (int32_t i = 0; i < n; ++i) {
    const auto& t = out.seqs[i]->block_table;
    std::copy(t.begin(), t.end(), out.block_tables.begin() + size_t(i) * w);
  }
}

std::shared_ptr<SchedulerOutput> Scheduler::schedule(std::optional<StepKind> forced) {
  auto out = std::make_shared<SchedulerOutput>();
  out->step_id = next_step_id_++;
  out->nextn = config_.nextn;
  out->block_size = config_.block_size;
  for (auto& s : pending_ignored_) out->ignored_request_ids.push_back(s->request_id);
  for (auto& s : pending_aborted_) out->aborted_request_ids.push_back(s->request_id);
  out->ignored_seqs.swap(pending_ignored_);
  out->aborted_seqs.swap(pending_aborted_);

  reserve(*out);
  bool try_prefill = !forced || *forced == StepKind::PREFILL;
  bool try_decode = !forced || *forced == StepKind::DECODE;
  if (try_prefill && schedule_prefill(*out)) {
    out->step_kind = StepKind::PREFILL;
  } else if (try_decode && schedule_decode(*out)) {
    out->step_kind = StepKind::DECODE;
  }
  finalize(*out);
  check_slot_invariant("schedule()");
  return out;
}

}  // namespace deepinfer
