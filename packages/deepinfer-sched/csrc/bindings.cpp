// Module _core: Scheduler, SchedulerOutput, Sequence, configs and enums. Long calls release the
// GIL; every Scheduler call takes the scheduler's mutex (after releasing the GIL: no lock order
// inversion), so a second Python thread cannot interleave with a step.
#include "bindings.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>

#include "build_request_outputs.hpp"
#include "scheduler.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace deepinfer;
using namespace deepinfer::bind;

namespace {

void bind_enums(nb::module_& m) {
  nb::enum_<StepKind>(m, "StepKind", nb::is_arithmetic())
      .value("IDLE", StepKind::IDLE)
      .value("PREFILL", StepKind::PREFILL)
      .value("DECODE", StepKind::DECODE);
  nb::enum_<SequenceStatus>(m, "SequenceStatus", nb::is_arithmetic())
      .value("WAITING", SequenceStatus::WAITING)
      .value("RUNNING", SequenceStatus::RUNNING)
      .value("FINISHED_STOPPED", SequenceStatus::FINISHED_STOPPED)
      .value("FINISHED_LENGTH", SequenceStatus::FINISHED_LENGTH)
      .value("FINISHED_ABORTED", SequenceStatus::FINISHED_ABORTED)
      .value("FINISHED_IGNORED", SequenceStatus::FINISHED_IGNORED);
  nb::enum_<FinishReason>(m, "FinishReason", nb::is_arithmetic())
      .value("NONE", FinishReason::NONE)
      .value("STOP", FinishReason::STOP)
      .value("LENGTH", FinishReason::LENGTH)
      .value("ABORT", FinishReason::ABORT)
      .value("PROMPT_LENGTH_EXCEEDED", FinishReason::PROMPT_LENGTH_EXCEEDED);
  nb::enum_<PrefixMiss>(m, "PrefixMiss", nb::is_arithmetic())
      .value("NONE", PrefixMiss::NONE)
      .value("DISABLED", PrefixMiss::DISABLED)
      .value("YOCO_KEEP", PrefixMiss::YOCO_KEEP)
      .value("NOT_CACHED", PrefixMiss::NOT_CACHED)
      .value("PARTIAL", PrefixMiss::PARTIAL)
      .value("SWA_REPLAY", PrefixMiss::SWA_REPLAY)
      .value("NO_SWA_SNAPSHOT", PrefixMiss::NO_SWA_SNAPSHOT);
  nb::class_<PrefixCacheStats>(m, "PrefixCacheStats")
      .def_ro("num_admissions", &PrefixCacheStats::num_admissions)
      .def_ro("num_prompt_tokens", &PrefixCacheStats::num_prompt_tokens)
      .def_ro("num_cached_tokens", &PrefixCacheStats::num_cached_tokens)
      .def_prop_ro("num_by_reason", [](const PrefixCacheStats& p) {
        nb::dict d;  // PrefixMiss name -> admissions
        const char* names[kNumPrefixMiss] = {"NONE",    "DISABLED",   "YOCO_KEEP",      "NOT_CACHED",
                                             "PARTIAL", "SWA_REPLAY", "NO_SWA_SNAPSHOT"};
        for (int i = 0; i < kNumPrefixMiss; ++i) d[names[i]] = p.num_by_reason[i];
        return d;
      });
}

void bind_configs(nb::module_& m) {
  nb::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(nb::init<>())
      .def_rw("block_size", &SchedulerConfig::block_size)
      .def_rw("num_blocks", &SchedulerConfig::num_blocks)
      .def_rw("max_num_seqs", &SchedulerConfig::max_num_seqs)
      .def_rw("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens)
      .def_rw("max_model_len", &SchedulerConfig::max_model_len)
      .def_rw("nextn", &SchedulerConfig::nextn)
      .def_rw("min_final_chunk_tokens", &SchedulerConfig::min_final_chunk_tokens)
      .def_rw("enable_prefix_caching", &SchedulerConfig::enable_prefix_caching)
      .def_rw("swa_snapshot_tokens", &SchedulerConfig::swa_snapshot_tokens)
      .def_rw("eos_token_ids", &SchedulerConfig::eos_token_ids)
      .def_rw("engram_vocab_map", &SchedulerConfig::engram_vocab_map)
      .def("validate", &SchedulerConfig::validate);
  nb::class_<RequestParams>(m, "RequestParams")
      .def(nb::init<>())
      .def_rw("max_tokens", &RequestParams::max_tokens)
      .def_rw("min_tokens", &RequestParams::min_tokens)
      .def_rw("stop_token_ids", &RequestParams::stop_token_ids)
      .def_rw("ignore_eos", &RequestParams::ignore_eos)
      .def("validate", &RequestParams::validate);
}

void bind_sequence(nb::module_& m) {
  nb::class_<Sequence>(m, "Sequence")
      .def("__init__",
           [](Sequence* self, int64_t request_id, std::vector<int32_t> prompt, const RequestParams& params) {
             params.validate();
             if (prompt.empty()) fail_value("prompt_token_ids must not be empty");
             for (int32_t t : prompt)
               if (t < 0) fail_value("prompt_token_ids must be >= 0, got ", t);
             new (self) Sequence(request_id, std::move(prompt), params, 0, nullptr);
           },
           "request_id"_a, "prompt_token_ids"_a, "params"_a)
      .def_ro("request_id", &Sequence::request_id)
      .def_ro("status", &Sequence::status)
      .def_ro("prompt_len", &Sequence::prompt_len)
      .def_ro("token_ids", &Sequence::token_ids)
      .def_ro("compressed_token_ids", &Sequence::compressed_token_ids)
      .def_prop_ro("output_token_ids",
                   [](const Sequence& s) {
                     return std::vector<int32_t>(s.token_ids.begin() + s.prompt_len, s.token_ids.end());
                   })
      .def_prop_ro("output_len", &Sequence::output_len)
      .def_ro("prefill_len", &Sequence::prefill_len)
      .def_ro("epoch", &Sequence::epoch)
      .def_prop_ro("num_tokens", [](const Sequence& s) { return s.cache.num_tokens; })
      .def_prop_ro("previous_num_tokens", [](const Sequence& s) { return s.cache.previous_num_tokens; })
      .def_prop_ro("num_uncommitted_rows", [](const Sequence& s) { return s.cache.num_uncommitted_rows; })
      .def_prop_ro("num_inflight_steps", [](const Sequence& s) { return s.cache.num_inflight_steps; })
      .def_prop_ro("num_committed_tokens", [](const Sequence& s) { return s.cache.num_committed_tokens(); })
      .def_prop_ro("info_slot", [](const Sequence& s) { return s.mtp.info_slot; })
      .def_ro("state_slot", &Sequence::state_slot)
      .def_ro("num_cached_tokens", &Sequence::num_cached_tokens)
      .def_ro("prefix_miss", &Sequence::prefix_miss)
      .def_prop_ro("last_output_token", [](const Sequence& s) { return s.mtp.last_output_token; })
      .def_prop_ro("prev_confidence", [](const Sequence& s) { return s.mtp.prev_confidence; })
      .def_ro("block_table", &Sequence::block_table)
      .def_ro("num_hashed_blocks", &Sequence::num_hashed_blocks)
      .def_prop_ro("needs_prefill", &Sequence::needs_prefill)
      .def_prop_ro("is_finished", &Sequence::is_finished)
      .def("append_token_id",
           [](Sequence& s, int32_t t) {
             if (t < 0) fail_value("token_id must be >= 0, got ", t);
             s.append_token_id(t, nullptr);
           })
      .def("advance_optimistically",
           [](Sequence& s, int32_t n) {
             if (n < 1) fail_value("seqlen_q must be >= 1, got ", n);
             s.cache.advance_optimistically(n);
           })
      .def("commit_processed_tokens",
           [](Sequence& s, int32_t rows, int32_t kept) { s.cache.commit_processed_tokens(s.request_id, rows, kept); },
           "rows_scheduled"_a, "rows_kept"_a)
      .def("reset_for_recompute", &Sequence::reset_for_recompute);
}

void bind_scheduler_output(nb::module_& m) {
  using SO = SchedulerOutput;
  auto cls = nb::class_<SO>(m, "SchedulerOutput");
  cls.def_ro("step_id", &SO::step_id)
      .def_ro("step_kind", &SO::step_kind)
      .def_ro("nextn", &SO::nextn)
      .def_ro("block_size", &SO::block_size)
      .def_prop_ro("req_cnt", &SO::req_cnt)
      .def_prop_ro("total_q", &SO::total_q)
      .def_ro("processed", &SO::processed)
      .def_ro("ignored_request_ids", &SO::ignored_request_ids)
      .def_ro("aborted_request_ids", &SO::aborted_request_ids)
      .def_ro("preempted_request_ids", &SO::preempted_request_ids);
#define DI_VIEW(name) cls.def_prop_ro(#name, [](const SO& o) { return view(o.name, nb::find(o)); })
  DI_VIEW(request_ids);
  DI_VIEW(seqlens_q);
  DI_VIEW(first_token_pos);
  DI_VIEW(num_computed_tokens);
  DI_VIEW(context_lens);
  DI_VIEW(prompt_lens);
  DI_VIEW(mtp_slots);
  DI_VIEW(state_slots);
  DI_VIEW(restore_tokens);
  DI_VIEW(restore_keys);
  DI_VIEW(swa_points);
  DI_VIEW(swa_keys);
  DI_VIEW(remap);
  DI_VIEW(num_uncommitted_rows);
  DI_VIEW(positions);
  DI_VIEW(input_token_ids);
  DI_VIEW(input_engram_ids);
  DI_VIEW(slot_mapping);
  DI_VIEW(pushed);
  DI_VIEW(num_accepted);
  DI_VIEW(kept_rows);
  DI_VIEW(output_len_before);
#undef DI_VIEW
  cls.def_prop_ro("is_last_chunk", [](const SO& o) {
    auto* heap = new std::vector<uint8_t>(o.is_last_chunk);
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
    return nb::ndarray<nb::numpy, bool, nb::ndim<1>>(reinterpret_cast<bool*>(heap->data()), {heap->size()}, owner);
  }, nb::rv_policy::automatic);
  cls.def_prop_ro("block_tables",
                  [](const SO& o) { return view2d(o.block_tables, size_t(o.req_cnt()), size_t(o.max_blocks), nb::find(o)); });
  cls.def_prop_ro("num_drafts", [](const SO& o) {
    std::vector<int32_t> d(o.seqlens_q.size(), 0);
    if (o.step_kind == StepKind::DECODE)
      for (size_t i = 0; i < d.size(); ++i) d[i] = o.seqlens_q[i] - 1;
    return to_numpy(std::move(d));
  }, nb::rv_policy::automatic);
  cls.def("__repr__", [](const SO& o) {
    const char* k = o.step_kind == StepKind::PREFILL ? "PREFILL" : o.step_kind == StepKind::DECODE ? "DECODE" : "IDLE";
    return str_cat("SchedulerOutput(step_id=", o.step_id, ", step_kind=", k, ", req_cnt=", o.req_cnt(),
                   ", total_q=", o.total_q(), ", ignored=", o.ignored_request_ids.size(),
                   ", aborted=", o.aborted_request_ids.size(), ")");
  });
}

void bind_scheduler(nb::module_& m) {
  nb::class_<Scheduler>(m, "Scheduler")
      .def(nb::init<SchedulerConfig>(), "config"_a)
      .def("add_request",
           [](Scheduler& s, int64_t id, In1D<int32_t> prompt, const RequestParams& params) {
             std::vector<int32_t> p(prompt.data(), prompt.data() + prompt.shape(0));
             std::lock_guard<std::mutex> lock(s.mutex());
             s.add_request(id, std::move(p), params);
           },
           "request_id"_a, "prompt_token_ids"_a, "params"_a)
      .def("abort_request",
           [](Scheduler& s, int64_t id) {
             std::lock_guard<std::mutex> lock(s.mutex());
             return s.abort_request(id);
           },
           "request_id"_a)
      .def("set_num_drafts",
           [](Scheduler& s, In1D<int64_t> ids, In1D<int32_t> drafts) {
             if (ids.shape(0) != drafts.shape(0))
               fail_value("request_ids and num_drafts must have the same length, got ", ids.shape(0), " and ",
                          drafts.shape(0));
             std::lock_guard<std::mutex> lock(s.mutex());
             s.set_num_drafts(ids.data(), drafts.data(), ids.shape(0));
           },
           "request_ids"_a, "num_drafts"_a)
      .def("schedule",
           [](Scheduler& s, std::optional<StepKind> kind) {
             nb::gil_scoped_release nogil;
             std::lock_guard<std::mutex> lock(s.mutex());
             return s.schedule(kind);
           },
           "step_kind"_a = nb::none())
      .def("process_outputs",
           [](Scheduler& s, SchedulerOutput& out, In1D<int32_t> token_ids, std::optional<In1D<int32_t>> verified,
              std::optional<In2D<float>> confidence, std::optional<In1D<int32_t>> ftp) {
             SampledInfo in;
             in.token_ids = token_ids.data();
             in.num_token_ids = token_ids.shape(0);
             in.verified_token_ids = data_or_null<int32_t>(verified);
             in.num_verified = size_or_zero(verified);
             if (confidence) {
               in.confidence = confidence->data();
               in.confidence_rows = confidence->shape(0);
               in.confidence_cols = confidence->shape(1);
             }
             in.first_token_positions = data_or_null<int32_t>(ftp);
             in.num_ftp = size_or_zero(ftp);
             std::vector<int32_t> pushed;
             {
               nb::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(s.mutex());
               pushed = s.process_outputs(out, in);
             }
             return to_numpy(std::move(pushed));
           },
           "out"_a, "token_ids"_a, "verified_token_ids"_a = nb::none(), "confidence"_a = nb::none(),
           "first_token_positions"_a = nb::none())
      .def("build_request_outputs",
           [](Scheduler& s, const SchedulerOutput& out, In1D<int32_t> pushed, RequestOutputPool& pool,
              std::optional<In1D<float>> token_logprobs, std::optional<In1D<float>> verified_logprobs,
              std::optional<In1D<int32_t>> ftp) {
             OutputLogprobs lp;
             lp.token_logprobs = data_or_null<float>(token_logprobs);
             lp.num_token_logprobs = size_or_zero(token_logprobs);
             lp.verified_logprobs = data_or_null<float>(verified_logprobs);
             lp.num_verified_logprobs = size_or_zero(verified_logprobs);
             lp.first_token_positions = data_or_null<int32_t>(ftp);
             lp.num_ftp = size_or_zero(ftp);
             std::vector<uint64_t> handles;
             {
               nb::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(s.mutex());
               handles = build_request_outputs(out, pushed.data(), pushed.shape(0), pool, lp);
             }
             return to_numpy(std::move(handles));
           },
           "out"_a, "pushed"_a, "pool"_a, "token_logprobs"_a = nb::none(), "verified_logprobs"_a = nb::none(),
           "first_token_positions"_a = nb::none())
#define DI_LOCKED(name, expr)                       \
  def(name, [](const Scheduler& s) {                \
    std::lock_guard<std::mutex> lock(s.mutex());    \
    return expr;                                    \
  })
      .DI_LOCKED("has_unfinished", s.has_unfinished())
      .DI_LOCKED("has_prefill_work", s.has_prefill_work())
      .DI_LOCKED("has_decode_work", s.has_decode_work())
      .DI_LOCKED("num_waiting", s.num_waiting())
      .DI_LOCKED("num_running", s.num_running())
      .DI_LOCKED("num_free_blocks", s.block_manager().num_free_blocks())
      .DI_LOCKED("num_cached_blocks", s.block_manager().num_cached_blocks())
      .DI_LOCKED("num_used_mtp_slots", s.num_used_mtp_slots())
      .DI_LOCKED("num_used_state_slots", s.num_used_state_slots())
      .DI_LOCKED("prefix_cache_stats", s.prefix_cache_stats())
#undef DI_LOCKED
      .def("add_swa_snapshot",
           [](Scheduler& s, uint64_t key) {
             std::lock_guard<std::mutex> lock(s.mutex());
             s.add_swa_snapshot(key);
           },
           "key"_a)
      .def("remove_swa_snapshot",
           [](Scheduler& s, uint64_t key) {
             std::lock_guard<std::mutex> lock(s.mutex());
             return s.remove_swa_snapshot(key);
           },
           "key"_a)
      .def("num_swa_snapshots",
           [](const Scheduler& s) {
             std::lock_guard<std::mutex> lock(s.mutex());
             return s.num_swa_snapshots();
           })
      .def("block_ref_count",
           [](const Scheduler& s, int32_t block) {
             std::lock_guard<std::mutex> lock(s.mutex());
             return s.block_manager().ref_count(block);
           },
           "block_id"_a)
      .def("get_sequence",
           [](const Scheduler& s, int64_t id) {
             std::lock_guard<std::mutex> lock(s.mutex());
             return s.snapshot(id);
           },
           "request_id"_a)
      .def_prop_ro("config", [](const Scheduler& s) { return s.config(); });
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "deepinfer_sched C++ core: scheduler, KV ledger, RequestOutput pool (torch-free).";
  nb::exception<LedgerError>(m, "LedgerError", PyExc_RuntimeError);
  m.attr("VERIFIED_END") = kVerifiedEnd;
  m.attr("NO_TOKEN") = kNoToken;
  m.attr("MIN_LOGPROB") = kMinLogprob;
  m.attr("MAX_NEXTN") = kMaxNextn;
  bind_enums(m);
  bind_configs(m);
  bind_sequence(m);
  bind_scheduler_output(m);
  bind_outputs(m);
  bind_misc(m);
  bind_scheduler(m);
}
