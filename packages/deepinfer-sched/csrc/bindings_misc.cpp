// Bindings of the pure helpers: ZOS remap, runtime estimators, DP step-type vote.
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>

#include "bindings.hpp"
#include "runtime_estimators.hpp"
#include "state_slots.hpp"
#include "step_vote.hpp"
#include "zos.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace deepinfer;

namespace deepinfer::bind {

void bind_misc(nb::module_& m) {
  m.def("prepare_zos_inputs",
        [](In1D<int64_t> prev, In1D<int64_t> ids) {
          return to_numpy(prepare_zos_inputs(prev.data(), prev.shape(0), ids.data(), ids.shape(0)));
        },
        "prev_request_ids"_a, "request_ids"_a);

  nb::class_<SamplerRuntimeEstimator>(m, "SamplerRuntimeEstimator")
      .def(nb::init<int32_t>(), "window_size"_a = 64)
      .def("add", &SamplerRuntimeEstimator::add, "sampler_ms"_a)
      .def("estimate_ms", &SamplerRuntimeEstimator::estimate_ms)
      .def_prop_ro("num_samples", &SamplerRuntimeEstimator::num_samples)
      .def_prop_ro("window_size", &SamplerRuntimeEstimator::window_size);
  nb::class_<ForwardRuntimeEstimator>(m, "ForwardRuntimeEstimator")
      .def(nb::init<int32_t, int32_t>(), "window_size"_a = 256, "min_samples"_a = 4)
      .def("add", &ForwardRuntimeEstimator::add, "graph_size"_a, "forward_ms"_a, "baseline_ms"_a)
      .def("slope_ms", &ForwardRuntimeEstimator::slope_ms)
      .def("estimate_ms", &ForwardRuntimeEstimator::estimate_ms, "graph_size"_a, "baseline_ms"_a)
      .def_prop_ro("num_samples", &ForwardRuntimeEstimator::num_samples);

  nb::class_<StateSlotPool>(m, "StateSlotPool")
      .def(nb::init<int32_t>(), "num_slots"_a)
      .def("can_take", &StateSlotPool::can_take)
      .def("take", &StateSlotPool::take)
      .def("release", &StateSlotPool::release, "slot"_a)
      .def("in_use", &StateSlotPool::in_use, "slot"_a)
      .def_prop_ro("num_slots", &StateSlotPool::num_slots)
      .def_prop_ro("num_used", &StateSlotPool::num_used)
      .def_prop_ro("num_free", &StateSlotPool::num_free);

  nb::enum_<AttemptPoint>(m, "AttemptPoint", nb::is_arithmetic())
      .value("NONE", AttemptPoint::NONE)
      .value("ALL", AttemptPoint::ALL)
      .value("ANY", AttemptPoint::ANY);
  m.def("prefill_attempt_point", &prefill_attempt_point, "decode_steps_since_prefill"_a,
        "all_interval"_a = kDefaultPrefillAttemptInterval, "any_interval"_a = kDefaultPrefillAnyAttemptInterval);
  m.def("step_type_vote", &step_type_vote, "has_prefill_work"_a, "has_decode_work"_a);
  m.def("decide_step_kind", &decide_step_kind, "min_vote"_a, "point"_a);
}

}  // namespace deepinfer::bind
