// kernels_maxpool2d.cpp — direct 2-D max pooling (forward with argmax, backward scatter) behind
// tinylearn.nn.functional.max_pool2d's fast path (tinylearn/nn/functional_pool.py). Part of _C.kernels (several
// files register into it, see registry.h).
//
//   maxpool2d_forward(x [N,C,H,W], kh,kw, sh,sw, ph,pw, dh,dw, OH,OW) -> (y [N,C,OH,OW], idx [N,C,OH,OW] int64)
//       y = max over the in-bounds taps of each window (padding never wins); idx = h*W + w of the first maximum
//       (row-major tap order), a NaN tap wins over any number (the first NaN), like np.argmax over the window.
//       A window whose taps are all -inf points at its first in-bounds tap (torch's initial index).
//   maxpool2d_backward(g [N,C,OH,OW], idx, H, W) -> dx [N,C,H,W]:  dx[n,c].flat[idx] += g  (overlapping windows add)
//
// Why direct loops and not im2col + argmax (tinylearn/conv/pooling.py): the pooled tensors of a small CNN are tiny
// (50k outputs) and numpy's argmax over a strided window axis walks them one 2-element row at a time: ~2 ms per
// pool on the dev box versus ~0.05 ms here. One thread on purpose: the work is far below what pays for waking
// OpenMP workers while numpy's BLAS workers spin between the step's GEMMs (see optim.cpp). No SIMD intrinsics: one
// scalar path, the same on every CPU level.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

#include "registry.h"

namespace py = pybind11;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

void check_geometry(ssize_t H, ssize_t W, ssize_t kh, ssize_t kw, ssize_t sh, ssize_t sw, ssize_t ph, ssize_t pw,
                    ssize_t dh, ssize_t dw, ssize_t OH, ssize_t OW) {
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || ph < 0 || pw < 0)
    tl::value_error("maxpool2d_forward: kernel/stride/dilation must be >= 1 and padding >= 0");
  if (OH < 1 || OW < 1) tl::value_error("maxpool2d_forward: output size must be >= 1");
  // every window lies inside the padded input; with padding <= kernel/2 each one holds an in-bounds tap
  if ((OH - 1) * sh + (kh - 1) * dh + 1 > H + 2 * ph || (OW - 1) * sw + (kw - 1) * dw + 1 > W + 2 * pw)
    tl::value_error("maxpool2d_forward: output size " + std::to_string(OH) + "x" + std::to_string(OW) +
                    " does not fit the padded input");
  if (2 * ph > kh || 2 * pw > kw) tl::value_error("maxpool2d_forward: padding must be at most half of the kernel");
}

// The 2x2 / stride 2 / no padding pool of the small CNNs, no bounds tests (every window is inside the image) and no
// data-dependent branch (the generic loop's compare-and-branch mispredicts on about half of random taps): the
// window's hit mask (taps equal to its maximum, or, when a tap is NaN, the NaN taps) and its lowest set bit give
// the first maximum in row-major tap order / the first NaN, as in the generic loop.
template <typename T>
void pool2x2(const T* px, T* py_, int64_t* pi, ssize_t planes, ssize_t H, ssize_t W, ssize_t OH, ssize_t OW) {
  const int64_t offs[4] = {0, 1, int64_t(W), int64_t(W) + 1};
  for (ssize_t p = 0; p < planes; ++p) {
    const T* xp = px + p * H * W;
    T* yp = py_ + p * OH * OW;
    int64_t* ip = pi + p * OH * OW;
    for (ssize_t oh = 0; oh < OH; ++oh) {
      const T* r0 = xp + 2 * oh * W;
      const T* r1 = r0 + W;
      for (ssize_t ow = 0; ow < OW; ++ow) {
        const T v0 = r0[2 * ow], v1 = r0[2 * ow + 1], v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
        const T mx = std::max(std::max(v0, v1), std::max(v2, v3));  // meaningless when a tap is NaN: unused then
        const unsigned n = unsigned(v0 != v0) | unsigned(v1 != v1) << 1 | unsigned(v2 != v2) << 2 |
                           unsigned(v3 != v3) << 3;
        const unsigned e = unsigned(v0 == mx) | unsigned(v1 == mx) << 1 | unsigned(v2 == mx) << 2 |
                           unsigned(v3 == mx) << 3;
        const unsigned hit = n ? n : e;  // never 0: without NaN the maximum is one of the taps
        const int64_t k = 2 * oh * W + 2 * ow + offs[__builtin_ctz(hit)];
        yp[oh * OW + ow] = xp[k];
        ip[oh * OW + ow] = k;
      }
    }
  }
}

template <typename T>
std::tuple<Arr<T>, Arr<int64_t>> maxpool2d_forward(Arr<T> x, ssize_t kh, ssize_t kw, ssize_t sh, ssize_t sw,
                                                   ssize_t ph, ssize_t pw, ssize_t dh, ssize_t dw, ssize_t OH,
                                                   ssize_t OW) {
  if (x.ndim() != 4) tl::value_error("maxpool2d_forward: x must be 4-D [N, C, H, W]");
  const ssize_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  check_geometry(H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW);
  Arr<T> y({N, C, OH, OW});
  Arr<int64_t> idx({N, C, OH, OW});
  const T* px = x.data();
  T* py_ = y.mutable_data();
  int64_t* pi = idx.mutable_data();
  const ssize_t planes = N * C;
  {
    // the GIL is released for the loops only: returning y and idx copies Python handles (inc_ref needs the GIL)
    // (no `return` inside this scope: it would copy y and idx before `release` re-acquires the GIL)
    py::gil_scoped_release release;
    const bool fast2x2 = kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && dh == 1 && dw == 1;
    if (fast2x2) pool2x2(px, py_, pi, planes, H, W, OH, OW);  // the common pool
    for (ssize_t p = 0; p < (fast2x2 ? 0 : planes); ++p) {
      const T* xp = px + p * H * W;
      T* yp = py_ + p * OH * OW;
      int64_t* ip = pi + p * OH * OW;
      for (ssize_t oh = 0; oh < OH; ++oh) {
        const ssize_t h0 = oh * sh - ph;
        for (ssize_t ow = 0; ow < OW; ++ow) {
          const ssize_t w0 = ow * sw - pw;
          T best = -std::numeric_limits<T>::infinity();
          int64_t bi = -1;
          bool nan = false;
          for (ssize_t i = 0; i < kh && !nan; ++i) {
            const ssize_t h = h0 + i * dh;
            if (h < 0 || h >= H) continue;
            for (ssize_t j = 0; j < kw; ++j) {
              const ssize_t w = w0 + j * dw;
              if (w < 0 || w >= W) continue;
              const T v = xp[h * W + w];
              if (bi < 0) bi = h * W + w;  // the first in-bounds tap (kept when every tap is -inf)
              if (std::isnan(v)) {
                best = v;
                bi = h * W + w;
                nan = true;
                break;
              }
              if (v > best) {
                best = v;
                bi = h * W + w;
              }
            }
          }
          yp[oh * OW + ow] = best;
          ip[oh * OW + ow] = bi;
        }
      }
    }
  }
  return {y, idx};
}

template <typename T>
Arr<T> maxpool2d_backward(Arr<T> g, Arr<int64_t> idx, ssize_t H, ssize_t W) {
  if (g.ndim() != 4 || idx.ndim() != 4) tl::value_error("maxpool2d_backward: g and idx must be 4-D [N, C, OH, OW]");
  for (int d = 0; d < 4; ++d)
    if (g.shape(d) != idx.shape(d)) tl::value_error("maxpool2d_backward: g and idx shapes differ");
  if (H < 1 || W < 1) tl::value_error("maxpool2d_backward: H and W must be >= 1");
  const ssize_t N = g.shape(0), C = g.shape(1), OH = g.shape(2), OW = g.shape(3);
  Arr<T> dx({N, C, H, W});
  T* pd = dx.mutable_data();
  const T* pg = g.data();
  const int64_t* pi = idx.data();
  const ssize_t planes = N * C, HW = H * W, O = OH * OW;
  bool bad = false;
  {
    py::gil_scoped_release release;
    for (ssize_t k = 0; k < planes * HW; ++k) pd[k] = T(0);
    for (ssize_t p = 0; p < planes && !bad; ++p) {
      T* dp = pd + p * HW;
      const T* gp = pg + p * O;
      const int64_t* ip = pi + p * O;
      for (ssize_t o = 0; o < O; ++o) {
        const int64_t t = ip[o];
        if (t < 0 || t >= HW) {
          bad = true;
          break;
        }
        dp[t] += gp[o];
      }
    }
  }
  if (bad) tl::value_error("maxpool2d_backward: idx holds a position outside [0, H*W)");
  return dx;
}

}  // namespace

TL_REGISTER(kernels) {
  m.def("maxpool2d_forward", &maxpool2d_forward<float>, py::arg("x").noconvert(), py::arg("kh"), py::arg("kw"),
        py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("dh"), py::arg("dw"), py::arg("OH"),
        py::arg("OW"));
  m.def("maxpool2d_forward", &maxpool2d_forward<double>, py::arg("x").noconvert(), py::arg("kh"), py::arg("kw"),
        py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("dh"), py::arg("dw"), py::arg("OH"),
        py::arg("OW"));
  m.def("maxpool2d_backward", &maxpool2d_backward<float>, py::arg("g").noconvert(), py::arg("idx").noconvert(),
        py::arg("H"), py::arg("W"));
  m.def("maxpool2d_backward", &maxpool2d_backward<double>, py::arg("g").noconvert(), py::arg("idx").noconvert(),
        py::arg("H"), py::arg("W"));
}
