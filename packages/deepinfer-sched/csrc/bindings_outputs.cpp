// Bindings of RequestOutput (owned copy), RequestOutputView (borrowed, validated on every read)
// and RequestOutputPool (gather: numpy columns for the engine's fast path).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "request_output.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace deepinfer;

namespace deepinfer::bind {

namespace {

// A borrowed view of a pooled output: every field read re-validates the handle, so a view used
// after release raises instead of reading a reused slot.
struct RequestOutputView {
  const RequestOutputPool* pool;
  uint64_t handle;
  const RequestOutput& get() const { return pool->at(handle); }
};

const RequestOutput& ref(const RequestOutput& o) { return o; }
const RequestOutput& ref(const RequestOutputView& v) { return v.get(); }

std::string repr(const RequestOutput& o) {
  const char* reason = finish_reason_str(o.finish_reason);
  return str_cat("RequestOutput(request_id=", o.request_id, ", token_id=", o.token_id, ", token_logprob=",
                 o.token_logprob, ", finished=", o.finished ? "True" : "False", ", finish_reason=",
                 reason ? reason : "None", ", num_output_tokens=", o.num_output_tokens, ", prompt_len=",
                 o.prompt_len, ", draft_tok=", o.draft_tok, ", accept_tok=", o.accept_tok, ")");
}

template <typename C>
void bind_fields(nb::class_<C>& cls) {
  cls.def_prop_ro("request_id", [](const C& c) { return ref(c).request_id; })
      .def_prop_ro("token_id",
                   [](const C& c) -> std::optional<int32_t> {
                     int32_t t = ref(c).token_id;
                     return t == kNoToken ? std::nullopt : std::optional<int32_t>(t);
                   })
      .def_prop_ro("token_logprob", [](const C& c) { return ref(c).token_logprob; })
      .def_prop_ro("finished", [](const C& c) { return ref(c).finished; })
      .def_prop_ro("finish_reason",
                   [](const C& c) -> std::optional<std::string> {
                     const char* r = finish_reason_str(ref(c).finish_reason);
                     return r ? std::optional<std::string>(r) : std::nullopt;
                   })
      .def_prop_ro("stop_token_id",
                   [](const C& c) -> std::optional<int32_t> {
                     int32_t t = ref(c).stop_token_id;
                     return t < 0 ? std::nullopt : std::optional<int32_t>(t);
                   })
      .def_prop_ro("num_output_tokens", [](const C& c) { return ref(c).num_output_tokens; })
      .def_prop_ro("prompt_len", [](const C& c) { return ref(c).prompt_len; })
      .def_prop_ro("draft_tok", [](const C& c) { return ref(c).draft_tok; })
      .def_prop_ro("accept_tok", [](const C& c) { return ref(c).accept_tok; })
      .def_prop_ro("confidence",
                   [](const C& c) {
                     const RequestOutput& o = ref(c);
                     return std::vector<float>(o.confidence.begin(), o.confidence.begin() + o.num_confidence);
                   })
      .def("clone", [](const C& c) { return RequestOutput(ref(c)); })
      .def("__repr__", [](const C& c) { return repr(ref(c)); });
}

nb::dict gather(const RequestOutputPool& pool, In1D<uint64_t> handles) {
  const size_t n = handles.shape(0);
  std::vector<int64_t> request_id(n);
  std::vector<int32_t> token_id(n), stop_token_id(n), num_output_tokens(n), prompt_len(n), draft_tok(n), accept_tok(n);
  std::vector<float> token_logprob(n);
  std::vector<uint8_t> finished(n);
  std::vector<int8_t> finish_reason(n);
  {
    nb::gil_scoped_release nogil;
    pool.for_each(handles.data(), n, [&](size_t i, const RequestOutput& o) {
      request_id[i] = o.request_id;
      token_id[i] = o.token_id;
      token_logprob[i] = o.token_logprob;
      finished[i] = o.finished;
      finish_reason[i] = int8_t(o.finish_reason);
      stop_token_id[i] = o.stop_token_id;
      num_output_tokens[i] = o.num_output_tokens;
      prompt_len[i] = o.prompt_len;
      draft_tok[i] = o.draft_tok;
      accept_tok[i] = o.accept_tok;
    });
  }
  nb::dict d;
  d["request_id"] = to_numpy(std::move(request_id));
  d["token_id"] = to_numpy(std::move(token_id));
  d["token_logprob"] = to_numpy(std::move(token_logprob));
  auto* fin = new std::vector<uint8_t>(std::move(finished));
  nb::capsule owner(fin, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  d["finished"] = nb::ndarray<nb::numpy, bool, nb::ndim<1>>(reinterpret_cast<bool*>(fin->data()), {fin->size()}, owner);
  d["finish_reason"] = to_numpy(std::move(finish_reason));
  d["stop_token_id"] = to_numpy(std::move(stop_token_id));
  d["num_output_tokens"] = to_numpy(std::move(num_output_tokens));
  d["prompt_len"] = to_numpy(std::move(prompt_len));
  d["draft_tok"] = to_numpy(std::move(draft_tok));
  d["accept_tok"] = to_numpy(std::move(accept_tok));
  return d;
}

}  // namespace

void bind_outputs(nb::module_& m) {
  auto owned = nb::class_<RequestOutput>(m, "RequestOutput");
  bind_fields(owned);
  auto borrowed = nb::class_<RequestOutputView>(m, "RequestOutputView");
  bind_fields(borrowed);
  borrowed.def_ro("handle", &RequestOutputView::handle);

  nb::class_<RequestOutputPool>(m, "RequestOutputPool")
      .def(nb::init<size_t>(), "capacity"_a = RequestOutputPool::kDefaultCapacity)
      .def_prop_ro("capacity", &RequestOutputPool::capacity)
      .def_prop_ro("num_free", &RequestOutputPool::num_free)
      .def_prop_ro("num_in_use", &RequestOutputPool::num_in_use)
      .def("release",
           [](RequestOutputPool& p, In1D<uint64_t> handles) {
             nb::gil_scoped_release nogil;
             p.release(handles.data(), handles.shape(0));
           },
           "handles"_a)
      .def("get",
           [](const RequestOutputPool& p, uint64_t h) {
             p.at(h);  // validate now
             return RequestOutputView{&p, h};
           },
           "handle"_a, nb::keep_alive<0, 1>())
      .def("is_live", &RequestOutputPool::is_live, "handle"_a)
      .def_static("slot_of", &RequestOutputPool::slot_of, "handle"_a)
      .def("gather", &gather, "handles"_a);
}

}  // namespace deepinfer::bind
