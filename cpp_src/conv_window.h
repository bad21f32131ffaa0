// conv_window.h — the 2-D window geometry shared by conv_im2col.cpp (im2col / col2im, v0 / v1) and
// conv_implicit.cpp (the v2 implicit-GEMM conv2d): kernel / stride / padding / dilation checked into a Win, the output
// size, the float32/float64 C-contiguous argument check, and the valid output range of one kernel tap.
// Header-only, in namespace tl::conv_window.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common.h"

namespace tl::conv_window {

struct Win {
  ssize_t kh, kw, sh, sw, ph, pw, dh, dw;
};

inline std::string pair_str(ssize_t a, ssize_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

using tl::shape_str;

inline Win make_win(std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> p,
             std::pair<ssize_t, ssize_t> d) {
  if (k.first < 1 || k.second < 1) tl::value_error("kernel_size: must be positive, got " + pair_str(k.first, k.second));
  if (s.first < 1 || s.second < 1) tl::value_error("stride: must be positive, got " + pair_str(s.first, s.second));
  if (d.first < 1 || d.second < 1) tl::value_error("dilation: must be positive, got " + pair_str(d.first, d.second));
  if (p.first < 0 || p.second < 0) tl::value_error("padding: must be non-negative, got " + pair_str(p.first, p.second));
  return {k.first, k.second, s.first, s.second, p.first, p.second, d.first, d.second};
}

// Output size; raises when the dilated kernel does not fit in the padded input.
inline std::pair<ssize_t, ssize_t> out_size(const Win& w, ssize_t H, ssize_t W, const char* what) {
  const ssize_t eh = w.dh * (w.kh - 1) + 1, ew = w.dw * (w.kw - 1) + 1;
  if (eh > H + 2 * w.ph || ew > W + 2 * w.pw)
    tl::value_error(std::string("kernel_size: dilated kernel ") + pair_str(eh, ew) + " is larger than the padded " +
                    what + " " + pair_str(H + 2 * w.ph, W + 2 * w.pw));
  return {(H + 2 * w.ph - eh) / w.sh + 1, (W + 2 * w.pw - ew) / w.sw + 1};
}

inline void check_dtype(const py::array& a, const char* name) {
  if (!(py::isinstance<py::array_t<float>>(a) || py::isinstance<py::array_t<double>>(a)))
    throw py::type_error(std::string(name) + ": expected float32 or float64, got dtype " +
                         std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    tl::value_error(std::string(name) + ": must be C-contiguous, got shape " + shape_str(a));
}

// Below this many copied elements a parallel region costs more than it saves (thread wake-up, and on a

// Valid output range [lo, hi) of one axis for kernel tap offset `off` (= tap*dil - pad): 0 <= o*s + off < size.
inline std::pair<ssize_t, ssize_t> valid_range(ssize_t off, ssize_t s, ssize_t size, ssize_t out) {
  ssize_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
  ssize_t hi = size - off <= 0 ? 0 : (size - off - 1) / s + 1;
  hi = std::min(hi, out);
  lo = std::min(lo, hi);
  return {lo, hi};
}

}  // namespace tl::conv_window
