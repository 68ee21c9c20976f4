// Shared helpers of the nanobind bindings (numpy in/out without copies where possible).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <vector>

namespace deepinfer::bind {

namespace nb = nanobind;

template <typename T>
using In1D = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using In2D = nb::ndarray<const T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out1D = nb::ndarray<nb::numpy, T, nb::ndim<1>>;
template <typename T>
using View1D = nb::ndarray<nb::numpy, const T, nb::ndim<1>>;  // read-only view
template <typename T>
using View2D = nb::ndarray<nb::numpy, const T, nb::ndim<2>>;

// Moves a vector into a numpy array that owns it.
template <typename T>
Out1D<T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out1D<T>(heap->data(), {heap->size()}, owner);
}

// Read-only view of a vector held by `owner` (a Python object that keeps it alive).
template <typename T>
View1D<T> view(const std::vector<T>& v, nb::handle owner) {
  static const T empty{};
  return View1D<T>(v.empty() ? &empty : v.data(), {v.size()}, owner);
}

template <typename T>
View2D<T> view2d(const std::vector<T>& v, size_t rows, size_t cols, nb::handle owner) {
  static const T empty{};
  return View2D<T>(v.empty() ? &empty : v.data(), {rows, cols}, owner);
}

template <typename T, typename A>
const T* data_or_null(const std::optional<A>& a) {
  return a ? a->data() : nullptr;
}
template <typename A>
size_t size_or_zero(const std::optional<A>& a) {
  return a ? a->shape(0) : 0;
}

void bind_outputs(nb::module_& m);
void bind_misc(nb::module_& m);

}  // namespace deepinfer::bind
