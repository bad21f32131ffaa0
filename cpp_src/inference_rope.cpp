// inference_rope.cpp — rotate-half rotary position embedding (RoPE) in one pass, for tinylearn.inference.model.Rope.
//
//   forward   y = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]  (halves of the last dim)
//   backward  dx = g * cos + R^T(g * sin),          R^T([u1, u2]) = [u2, -u1]
//
// x is float32 [A, B, T, D] with any element strides except a unit last one (q/k arrive as the [B, H, T, hd]
// transposed view of a projection's [B, T, H, hd] output); cos/sin are C-contiguous float32 [Tc, D] with Tc = T
// (one row per position) or 1 (one position for every row). The result is a new C-contiguous [A, B, T, D] array.
// The numpy version (five strided passes over halves of an 8- or 16-wide last dim, temporaries for each) measured
// 37 us for [1, 8, 128, 16]; this loop reads x once and writes y once. Rows are split over OpenMP threads only from
// kRopeGrain elements (a decode step's [1, 8, 1, 16] is one row per head).
#include <algorithm>
#include <cstdint>

#include "common.h"
#include "registry.h"

namespace py = pybind11;

namespace {

constexpr int64_t kRopeGrain = int64_t(1) << 16;

py::array_t<float> rope(py::array_t<float> x, py::array_t<float, py::array::c_style | py::array::forcecast> cos,
                        py::array_t<float, py::array::c_style | py::array::forcecast> sin, bool inverse) {
  if (x.ndim() != 4)
    tl::value_error("x: expected a 4-D float32 array [A, B, T, D], got ndim " + std::to_string(x.ndim()));
  const int64_t A = x.shape(0), B = x.shape(1), T = x.shape(2), D = x.shape(3);
  if (D % 2) tl::value_error("x: the last dim must be even (rotate-half RoPE), got " + std::to_string(D));
  if (x.strides(3) != int64_t(sizeof(float)))
    tl::value_error("x: the last dim must have unit stride, got " + std::to_string(x.strides(3)) + " bytes");
  for (int i = 0; i < 3; ++i)
    if (x.strides(i) % int64_t(sizeof(float)))
      tl::value_error("x: strides must be whole float32 elements");
  if (cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(1) != D || sin.shape(1) != D || cos.shape(0) != sin.shape(0) ||
      (cos.shape(0) != T && cos.shape(0) != 1))
    tl::value_error("cos, sin: expected two [T, D] or [1, D] float32 arrays matching x [A, B, T, D]");
  const int64_t sa = x.strides(0) / 4, sb = x.strides(1) / 4, st = x.strides(2) / 4;
  const int64_t tc = cos.shape(0) == 1 ? 0 : D, h = D / 2, rows = A * B * T;
  py::array_t<float> out({A, B, T, D});
  const float* px = x.data();
  const float* pc = cos.data();
  const float* ps = sin.data();
  float* po = out.mutable_data();
  {  // forward: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2; inverse: y1 = x1 c1 + x2 s2, y2 = x2 c2 - x1 s1
    py::gil_scoped_release release;
    const bool par = rows * D >= kRopeGrain && tl::n_threads() > 1;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % T, ab = r / T, b = ab % B, a = ab / B;
      const float* xr = px + a * sa + b * sb + t * st;
      const float* c = pc + t * tc;
      const float* s = ps + t * tc;
      float* y = po + r * D;
      if (!inverse) {
        for (int64_t j = 0; j < h; ++j) {
          y[j] = xr[j] * c[j] - xr[j + h] * s[j];
          y[j + h] = xr[j + h] * c[j + h] + xr[j] * s[j + h];
        }
      } else {
        for (int64_t j = 0; j < h; ++j) {
          y[j] = xr[j] * c[j] + xr[j + h] * s[j + h];
          y[j + h] = xr[j + h] * c[j + h] - xr[j] * s[j];
        }
      }
    }
  }
  return out;
}

}  // namespace

TL_REGISTER(inference) {
  m.def("rope", &rope, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("inverse") = false,
        "rotate-half RoPE of float32 x [A, B, T, D] (any strides, unit last) with cos/sin [T or 1, D]: "
        "x*cos + rotate_half(x)*sin, or with inverse=True its transpose g*cos + R^T(g*sin) (the backward)");
}
