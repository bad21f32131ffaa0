// kernels_vec_math.cpp — test hooks for the vector math layer (cpp_src/vec_math.h) in _C.kernels:
//   vec_exp / vec_erf / vec_tanh / vec_log (x float32 array, path 'auto'|'scalar'|'avx2'|'avx512') -> same shape
//   vec_isa() -> the path 'auto' takes now ('scalar' | 'avx2' | 'avx512', after TINYLEARN_CPU_FEATURES)
// tests/test_vec_math.py measures their max ulp error against float64 numpy/scipy and checks the paths agree.
#include "common.h"
#include "vec_math.h"

namespace py = pybind11;

namespace {
using tl::vm::Fn;

py::array_t<float> vec_apply(Fn f, const char* name, py::array_t<float, py::array::c_style | py::array::forcecast> x,
                             const std::string& path) {
  const tl::vm::Isa isa = tl::vm::parse_isa(path, name);
  py::array_t<float> y(std::vector<ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* px = x.data();
  float* py_ = y.mutable_data();
  const int64_t n = x.size();
  py::gil_scoped_release release;
  tl::vm::apply(f, px, py_, n, isa);
  return y;
}
}  // namespace

TL_REGISTER(kernels) {
  m.def(
      "vec_exp", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                    const std::string& path) { return vec_apply(Fn::exp, "vec_exp", x, path); },
      py::arg("x"), py::arg("path") = "auto", "float32 exp of cpp_src/vec_math.h on the given path");
  m.def(
      "vec_erf", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                    const std::string& path) { return vec_apply(Fn::erf, "vec_erf", x, path); },
      py::arg("x"), py::arg("path") = "auto", "float32 erf of cpp_src/vec_math.h on the given path");
  m.def(
      "vec_tanh", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                     const std::string& path) { return vec_apply(Fn::tanh, "vec_tanh", x, path); },
      py::arg("x"), py::arg("path") = "auto", "float32 tanh of cpp_src/vec_math.h on the given path");
  m.def(
      "vec_log", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                    const std::string& path) { return vec_apply(Fn::log, "vec_log", x, path); },
      py::arg("x"), py::arg("path") = "auto", "float32 log of cpp_src/vec_math.h on the given path");
  m.def(
      "vec_isa", []() { return std::string(tl::vm::isa_name(tl::vm::best_isa())); },
      "the vector-math path the float32 kernels take now: 'scalar' | 'avx2' | 'avx512'");
}
