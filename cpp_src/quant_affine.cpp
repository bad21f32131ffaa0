// quant_affine.cpp — per-tensor affine quantization kernels for tinylearn.quant (bit-exact with torch).
//
// Versions:
//   quantize_per_tensor   q = clamp(nearbyint(fma(x, 1/scale, zero_point)), qmin, qmax)   float32 -> int8/uint8
//                         (torch's quantize_per_tensor evaluates exactly this: one rounding in the fused
//                         multiply-add, zero point added before rounding; NaN -> qmax like torch)
//   dequantize_per_tensor x = (q - zero_point) * scale                                   int8/uint8 -> float32
// Checked against torch in tests/test_quant.py (through tinylearn.quant.quantize / dequantize).
#include "registry.h"

#include <cmath>
#include <cstdint>

namespace py = pybind11;

namespace {

template <typename T>
py::array_t<T> quantize_impl(py::array_t<float, py::array::c_style> x, float scale, int zp, int qmin, int qmax) {
  py::array_t<T> out(std::vector<ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* px = x.data();
  T* po = out.mutable_data();
  const ssize_t n = x.size();
  const float inv = 1.0f / scale, fz = float(zp), lo = float(qmin), hi = float(qmax);
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (ssize_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(std::fma(px[i], inv, fz));
    po[i] = std::isnan(v) ? T(qmax) : T(v < lo ? lo : (v > hi ? hi : v));
  }
  return out;
}

py::array quantize_per_tensor(py::array_t<float, py::array::c_style> x, float scale, int zero_point, int qmin,
                              int qmax) {
  if (!(scale > 0.0f) || !std::isfinite(scale)) tl::value_error("quantize_per_tensor: scale must be finite and > 0");
  if (zero_point < qmin || zero_point > qmax) tl::value_error("quantize_per_tensor: zero_point outside [qmin, qmax]");
  if (qmin >= 0 && qmax <= 255) return quantize_impl<uint8_t>(x, scale, zero_point, qmin, qmax);
  if (qmin >= -128 && qmax <= 127) return quantize_impl<int8_t>(x, scale, zero_point, qmin, qmax);
  tl::value_error("quantize_per_tensor: [qmin, qmax] must fit int8 or uint8");
}

template <typename T>
py::array_t<float> dequantize_impl(py::array_t<T, py::array::c_style> q, float scale, int zp) {
  py::array_t<float> out(std::vector<ssize_t>(q.shape(), q.shape() + q.ndim()));
  const T* pq = q.data();
  float* po = out.mutable_data();
  const ssize_t n = q.size();
  const float fz = float(zp);
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (ssize_t i = 0; i < n; ++i) po[i] = (float(pq[i]) - fz) * scale;
  return out;
}

}  // namespace

TL_REGISTER(quant_affine) {
  m.doc() = "per-tensor affine quantize/dequantize (torch's arithmetic), OpenMP";
  m.def("quantize_per_tensor", &quantize_per_tensor, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("qmin"), py::arg("qmax"), "clamp(nearbyint(fma(x, 1/scale, zp))) as int8 (signed range) or uint8");
  m.def("dequantize_per_tensor_int8", &dequantize_impl<int8_t>, py::arg("q"), py::arg("scale"), py::arg("zero_point"));
  m.def("dequantize_per_tensor_uint8", &dequantize_impl<uint8_t>, py::arg("q"), py::arg("scale"),
        py::arg("zero_point"));
}
