// conv_im2col.cpp — im2col / col2im for tinylearn.conv (backend="cpp"), layout of torch.nn.functional.unfold/fold.
//
//   cols[n, (c*kh + i)*kw + j, oh*OW + ow] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]   (0 outside)
//   col2im is the adjoint: x[n, c, ih, iw] += cols[...] over all (i, j, oh, ow) that read (ih, iw).
//
// Layouts: "NKL" = unfold's [N, K, L]; "KNL" = [K, N*L], the whole batch as one GEMM operand (conv2d uses it:
// one [OC, K] x [K, N*L] GEMM instead of N GEMMs of [OC, K] x [K, L]).
//
// Versions (the ladder; version= selects one, tests check every version against v0, numpy and torch's unfold):
//   v0  OpenMP over the N*C image planes (schedule dynamic); per (i, j, oh) one output row of OW values: a bounds
//       test per row, memcpy of the valid span for stride 1, an indexed gather for other strides. col2im likewise.
//       Measured weakness: libgomp workers spin after the region and fight the OpenBLAS threads of the GEMM that
//       follows on a 2-core machine; in the KNL layout one plane's rows land N*L apart (scattered writes).
//   v1  (default) streaming: threads (std::thread, no spin) over input channels x kernel rows; item (c, i) owns
//       the contiguous block of kw rows of the column matrix and writes it front to back; valid (oh, ow) ranges
//       hoisted out of the row loop (memset / copy / memset, no per-element index test); stride 1 and 2 are
//       compile-time constants (memcpy, vectorised even-element gather). col2im v1 is the same loop nest with +=,
//       threaded over the (c, n) image planes.
//   v2  (conv2d_forward, conv2d_backward_weight) implicit GEMM: no column matrix at all; packed micro-kernels
//       (an 8x32 / 8x16 AVX-512 one, gemm.cpp's via gemm_ukr.h at the other levels) with B panels packed
//       straight from the image (AVX-512: masked row-segment loads for stride 1), one OpenMP team: conv_implicit.cpp.
// The window geometry both share (Win, make_win, out_size, check_dtype, valid_range) is conv_window.h.
// Also here: transpose01 (swap the two leading axes of [A, B, L] with an optional bias per A: the KNL GEMM output
// [OC, N, L] -> NCHW, and dY NCHW -> [OC, N*L]) and stream_copy (the STREAM "copy" kernel on the same threads,
// the bandwidth roof im2col is compared against).
// float32 and float64. All arguments are validated (ValueError naming the argument and shape) before any memory
// is touched; inputs must be C-contiguous (the Python wrapper makes them so). Checked against numpy and torch in
// tests/test_conv_im2col.py.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common.h"
#include "conv_window.h"

namespace py = pybind11;

namespace {

using namespace tl::conv_window;

constexpr ssize_t kParallelMinElems = ssize_t(1) << 16;
// A plain row copy does ~1 ns of work per element: threads pay off only from ~1 Mi elements (transpose01).
constexpr ssize_t kCopyMinElems = ssize_t(1) << 20;

// Column-matrix addressing: row r = (c*kh+i)*kw+j of image n starts at cols + n*bstride + r*rstride.
//   "NKL" (unfold layout [N, K, L]):  bstride = K*L, rstride = L
//   "KNL" (one GEMM for the whole batch, [K, N*L]): bstride = L, rstride = N*L
template <typename T>
void im2col_impl(const T* x, T* cols, ssize_t N, ssize_t C, ssize_t H, ssize_t W, const Win& w, ssize_t OH, ssize_t OW,
                 ssize_t bstride, ssize_t rstride) {
  const ssize_t KK = w.kh * w.kw;
#pragma omp parallel for schedule(dynamic, 1) if (N * C * KK * OH * OW >= kParallelMinElems)
  for (ssize_t nc = 0; nc < N * C; ++nc) {
    const T* plane = x + nc * H * W;
    T* out = cols + (nc / C) * bstride + (nc % C) * KK * rstride;
    for (ssize_t i = 0; i < w.kh; ++i)
      for (ssize_t j = 0; j < w.kw; ++j) {
        T* row = out + (i * w.kw + j) * rstride;
        const ssize_t joff = j * w.dw - w.pw;
        // valid ow range: 0 <= ow*sw + joff < W
        ssize_t ow_lo = joff >= 0 ? 0 : (-joff + w.sw - 1) / w.sw;
        ssize_t ow_hi = W - joff <= 0 ? 0 : (W - joff - 1) / w.sw + 1;
        if (ow_hi > OW) ow_hi = OW;
        if (ow_lo > ow_hi) ow_lo = ow_hi;
        for (ssize_t oh = 0; oh < OH; ++oh) {
          T* dst = row + oh * OW;
          const ssize_t ih = oh * w.sh - w.ph + i * w.dh;
          if (ih < 0 || ih >= H) {
            std::memset(dst, 0, sizeof(T) * OW);
            continue;
          }
          const T* src = plane + ih * W + joff;
          for (ssize_t ow = 0; ow < ow_lo; ++ow) dst[ow] = T(0);
          if (w.sw == 1) {
            if (ow_hi > ow_lo) std::memcpy(dst + ow_lo, src + ow_lo, sizeof(T) * (ow_hi - ow_lo));
          } else {
            for (ssize_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow] = src[ow * w.sw];
          }
          for (ssize_t ow = ow_hi; ow < OW; ++ow) dst[ow] = T(0);
        }
      }
  }
}

template <typename T>
void col2im_impl(const T* cols, T* x, ssize_t N, ssize_t C, ssize_t H, ssize_t W, const Win& w, ssize_t OH, ssize_t OW,
                 ssize_t bstride, ssize_t rstride) {
  const ssize_t KK = w.kh * w.kw;
#pragma omp parallel for schedule(dynamic, 1) if (N * C * KK * OH * OW >= kParallelMinElems)
  for (ssize_t nc = 0; nc < N * C; ++nc) {
    T* plane = x + nc * H * W;
    std::memset(plane, 0, sizeof(T) * H * W);
    const T* in = cols + (nc / C) * bstride + (nc % C) * KK * rstride;
    for (ssize_t i = 0; i < w.kh; ++i)
      for (ssize_t j = 0; j < w.kw; ++j) {
        const T* row = in + (i * w.kw + j) * rstride;
        const ssize_t joff = j * w.dw - w.pw;
        ssize_t ow_lo = joff >= 0 ? 0 : (-joff + w.sw - 1) / w.sw;
        ssize_t ow_hi = W - joff <= 0 ? 0 : (W - joff - 1) / w.sw + 1;
        if (ow_hi > OW) ow_hi = OW;
        for (ssize_t oh = 0; oh < OH; ++oh) {
          const ssize_t ih = oh * w.sh - w.ph + i * w.dh;
          if (ih < 0 || ih >= H) continue;
          const T* src = row + oh * OW;
          T* dst = plane + ih * W + joff;
          if (w.sw == 1) {
            for (ssize_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow] += src[ow];
          } else {
            for (ssize_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow * w.sw] += src[ow];
          }
        }
      }
  }
}

// ------------------------------------------------------------------------------------------------ v1 (streaming)
// Threads: a few std::threads that take items (channels) from a shared atomic counter. No OpenMP team here on
// purpose: after a parallel region libgomp's workers spin (GOMP_SPINCOUNT) and, on a 2-core machine, steal the
// cores from the OpenBLAS threads of the GEMM that follows im2col (measured: conv2d with v0 was slower than the
// numpy backend). The helpers are detached: the caller works through the items itself and then waits only for
// items a helper has *claimed* and not finished, never for a helper that the scheduler has not started yet (on a
// loaded machine that wait is a whole time slice). A late helper finds the counter exhausted and exits touching
// only the shared state it co-owns. Thread start-up costs ~20-50 us, far below a layer's ~1 ms im2col; below
// `min_elems` everything runs on the calling thread. The count follows OMP_NUM_THREADS (omp_get_max_threads).
struct WorkState {
  std::atomic<ssize_t> next{0}, done{0};
  std::function<void(ssize_t)> body;  // valid while the caller waits: only called for claimed items
};

template <typename F>
void run_over(ssize_t items, ssize_t work_elems, F&& body, ssize_t min_elems = kParallelMinElems) {
  const ssize_t nt = work_elems >= min_elems ? std::min<ssize_t>(tl::n_threads(), items) : 1;
  if (nt <= 1) {
    for (ssize_t it = 0; it < items; ++it) body(it);
    return;
  }
  auto st = std::make_shared<WorkState>();
  st->body = [&body](ssize_t it) { body(it); };
  auto drain = [items](WorkState& w) {
    for (ssize_t it; (it = w.next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      w.body(it);
      w.done.fetch_add(1, std::memory_order_release);
    }
  };
  for (ssize_t t = 1; t < nt; ++t) std::thread([st, drain] { drain(*st); }).detach();
  drain(*st);
  while (st->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
}

// One output row of OW values: zeros where the window falls in the padding ([0, lo) and [hi, OW)), in between a
// contiguous copy (stride 1) or a fixed-stride gather from `src`, which points at the input element of output
// column lo. The stride is a template constant for 1 and 2 so the compiler emits memcpy / a vectorised
// even-element shuffle.
template <int SW, typename T>
inline void fill_row(T* dst, const T* src, ssize_t OW, ssize_t lo, ssize_t hi, ssize_t sw) {
  if (lo > 0) std::memset(dst, 0, sizeof(T) * lo);
  T* d = dst + lo;
  const ssize_t n = hi - lo;
  if constexpr (SW == 1) {
    if (n > 0) std::memcpy(d, src, sizeof(T) * n);
  } else if constexpr (SW == 2) {
    for (ssize_t q = 0; q < n; ++q) d[q] = src[2 * q];
  } else {
    for (ssize_t q = 0; q < n; ++q, src += sw) d[q] = *src;
  }
  if (hi < OW) std::memset(dst + hi, 0, sizeof(T) * (OW - hi));
}

// v1 im2col: one work item = (input channel c, kernel row i), which owns the kw rows (c*kh+i)*kw+j of the column
// matrix. In the KNL layout those rows are one contiguous block, so each thread streams its writes front to back;
// the N input planes of channel c (N*H*W values, L2-resident for the layer sizes here) are re-read per item. Items
// are channels x kernel rows (not channels alone) so that a 1- or 3-channel input layer still splits evenly.
// Per (i, j) the valid oh / ow ranges are computed once, so the loop over rows is memset / copy / memset with
// no bounds test per element and no division anywhere inside it.
template <int SW, typename T>
void im2col_v1(const T* x, T* cols, ssize_t N, ssize_t C, ssize_t H, ssize_t W, const Win& w, ssize_t OH, ssize_t OW,
               ssize_t bstride, ssize_t rstride) {
  const ssize_t KK = w.kh * w.kw, L = OH * OW;
  run_over(C * w.kh, N * C * KK * L, [&](ssize_t ci) {
    const ssize_t c = ci / w.kh, i = ci % w.kh;  // one item: channel c, kernel row i (kw contiguous rows)
    {
      const auto [oh_lo, oh_hi] = valid_range(i * w.dh - w.ph, w.sh, H, OH);
      for (ssize_t j = 0; j < w.kw; ++j) {
        const ssize_t joff = j * w.dw - w.pw;
        const auto [ow_lo, ow_hi] = valid_range(joff, w.sw, W, OW);
        const ssize_t col0 = ow_lo < ow_hi ? joff + ow_lo * w.sw : 0;  // input column of output column ow_lo
        T* row = cols + ((c * w.kh + i) * w.kw + j) * rstride;
        for (ssize_t n = 0; n < N; ++n) {
          T* dst = row + n * bstride;
          const T* plane = x + (n * C + c) * H * W;
          if (oh_lo > 0) std::memset(dst, 0, sizeof(T) * oh_lo * OW);
          // every pointer formed stays inside the plane: row ih >= 0 of the first valid oh, column >= 0 of ow_lo
          for (ssize_t oh = oh_lo; oh < oh_hi; ++oh)
            fill_row<SW>(dst + oh * OW, plane + (oh * w.sh - w.ph + i * w.dh) * W + col0, OW, ow_lo, ow_hi, w.sw);
          if (oh_hi < OH) std::memset(dst + oh_hi * OW, 0, sizeof(T) * (OH - oh_hi) * OW);
        }
      }
    }
  });
}

// v1 col2im: the adjoint, threaded over image planes (c, n). Plane (n, c) is zeroed, then the kh*kw column
// rows are added in ascending (i, j) order (torch's fold order: bit-identical fp32), each over its precomputed
// valid (oh, ow) range only.
template <int SW, typename T>
void col2im_v1(const T* cols, T* x, ssize_t N, ssize_t C, ssize_t H, ssize_t W, const Win& w, ssize_t OH, ssize_t OW,
               ssize_t bstride, ssize_t rstride) {
  run_over(C * N, N * C * w.kh * w.kw * OH * OW, [&](ssize_t cn) {
    const ssize_t c = cn / N, n = cn % N;  // one item: plane (n, c), owned by one thread (no atomics)
    {
      T* plane = x + (n * C + c) * H * W;
      std::memset(plane, 0, sizeof(T) * H * W);
      for (ssize_t i = 0; i < w.kh; ++i) {
        const auto [oh_lo, oh_hi] = valid_range(i * w.dh - w.ph, w.sh, H, OH);
        for (ssize_t j = 0; j < w.kw; ++j) {
          const ssize_t joff = j * w.dw - w.pw;
          const auto [ow_lo, ow_hi] = valid_range(joff, w.sw, W, OW);
          const T* row = cols + ((c * w.kh + i) * w.kw + j) * rstride + n * bstride;
          if (ow_lo >= ow_hi) continue;
          const ssize_t col0 = joff + ow_lo * w.sw, n_ow = ow_hi - ow_lo;
          const ssize_t sw = SW > 0 ? SW : w.sw;
          for (ssize_t oh = oh_lo; oh < oh_hi; ++oh) {
            const T* s = row + oh * OW + ow_lo;
            T* d = plane + (oh * w.sh - w.ph + i * w.dh) * W + col0;
            for (ssize_t q = 0; q < n_ow; ++q) d[q * sw] += s[q];
          }
        }
      }
    }
  });
}

template <typename T>
void im2col_dispatch(const std::string& version, const T* x, T* cols, ssize_t N, ssize_t C, ssize_t H, ssize_t W,
                     const Win& w, ssize_t OH, ssize_t OW, ssize_t bs, ssize_t rs) {
  if (version == "v0") return im2col_impl(x, cols, N, C, H, W, w, OH, OW, bs, rs);
  if (w.sw == 1) return im2col_v1<1>(x, cols, N, C, H, W, w, OH, OW, bs, rs);
  if (w.sw == 2) return im2col_v1<2>(x, cols, N, C, H, W, w, OH, OW, bs, rs);
  im2col_v1<0>(x, cols, N, C, H, W, w, OH, OW, bs, rs);
}

template <typename T>
void col2im_dispatch(const std::string& version, const T* cols, T* x, ssize_t N, ssize_t C, ssize_t H, ssize_t W,
                     const Win& w, ssize_t OH, ssize_t OW, ssize_t bs, ssize_t rs) {
  if (version == "v0") return col2im_impl(cols, x, N, C, H, W, w, OH, OW, bs, rs);
  if (w.sw == 1) return col2im_v1<1>(cols, x, N, C, H, W, w, OH, OW, bs, rs);
  if (w.sw == 2) return col2im_v1<2>(cols, x, N, C, H, W, w, OH, OW, bs, rs);
  col2im_v1<0>(cols, x, N, C, H, W, w, OH, OW, bs, rs);
}

bool parse_layout(const std::string& layout) {
  if (layout == "NKL") return true;
  if (layout != "KNL") tl::value_error("layout: expected 'NKL' or 'KNL', got '" + layout + "'");
  return false;
}

void check_version(const std::string& version) {
  if (version != "v0" && version != "v1") tl::value_error("version: expected 'v0' or 'v1', got '" + version + "'");
}

// `out` (optional): a C-contiguous array of the result's shape and dtype to write into (a reused workspace skips
// the page faults of a fresh multi-MB allocation).
py::array result_array(const py::object& out, const std::vector<ssize_t>& shape, bool f32, const char* what) {
  if (out.is_none()) return f32 ? py::array(py::array_t<float>(shape)) : py::array(py::array_t<double>(shape));
  if (!py::isinstance<py::array>(out)) throw py::type_error(std::string("out: expected a numpy array for ") + what);
  py::array o = py::reinterpret_borrow<py::array>(out);
  bool ok = o.ndim() == ssize_t(shape.size()) && (o.flags() & py::array::c_style) && o.writeable() &&
            (f32 ? py::isinstance<py::array_t<float>>(o) : py::isinstance<py::array_t<double>>(o));
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = o.shape(ssize_t(i)) == shape[i];
  if (!ok) {
    std::string want = "(";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    tl::value_error(std::string("out: expected a writeable C-contiguous ") + (f32 ? "float32" : "float64") +
                    " array of shape " + want + ") for " + what + ", got shape " + shape_str(o) + " dtype " +
                    std::string(py::str(o.dtype())));
  }
  return o;
}

py::array im2col(const py::array& x, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
                 std::pair<ssize_t, ssize_t> p, std::pair<ssize_t, ssize_t> d, const std::string& layout,
                 const std::string& version, const py::object& out) {
  if (x.ndim() != 4) tl::value_error("x: expected a 4-D [N, C, H, W] array, got shape " + shape_str(x));
  check_dtype(x, "x");
  const bool nkl = parse_layout(layout);
  check_version(version);
  const Win w = make_win(k, s, p, d);
  const ssize_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  auto [OH, OW] = out_size(w, H, W, "input");
  const ssize_t K = C * w.kh * w.kw, L = OH * OW;
  const bool f32 = py::isinstance<py::array_t<float>>(x);
  std::vector<ssize_t> shape = nkl ? std::vector<ssize_t>{N, K, L} : std::vector<ssize_t>{K, N * L};
  py::array cols = result_array(out, shape, f32, "im2col");
  const ssize_t bs = nkl ? K * L : L, rs = nkl ? L : N * L;
  const void* src = x.data();
  void* dst = cols.mutable_data();
  {
    py::gil_scoped_release release;
    if (f32)
      im2col_dispatch(version, static_cast<const float*>(src), static_cast<float*>(dst), N, C, H, W, w, OH, OW, bs,
                      rs);
    else
      im2col_dispatch(version, static_cast<const double*>(src), static_cast<double*>(dst), N, C, H, W, w, OH, OW, bs,
                      rs);
  }
  return cols;
}

py::array col2im(const py::array& cols, std::pair<ssize_t, ssize_t> output_size, std::pair<ssize_t, ssize_t> k,
                 std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> p, std::pair<ssize_t, ssize_t> d,
                 const std::string& layout, ssize_t batch, const std::string& version) {
  const bool nkl = parse_layout(layout);
  check_version(version);
  if (nkl && cols.ndim() != 3)
    tl::value_error("cols: expected a 3-D [N, C*kh*kw, L] array, got shape " + shape_str(cols));
  if (!nkl && cols.ndim() != 2)
    tl::value_error("cols: expected a 2-D [C*kh*kw, N*L] array for layout KNL, got shape " + shape_str(cols));
  check_dtype(cols, "cols");
  const Win w = make_win(k, s, p, d);
  const ssize_t H = output_size.first, W = output_size.second;
  if (H < 1 || W < 1) tl::value_error("output_size: must be positive, got " + pair_str(H, W));
  const ssize_t N = nkl ? cols.shape(0) : batch, CK = nkl ? cols.shape(1) : cols.shape(0);
  if (N < 1) tl::value_error("batch: must be positive for layout KNL, got " + std::to_string(N));
  const ssize_t KK = w.kh * w.kw;
  if (CK % KK != 0)
    tl::value_error("cols: rows (" + std::to_string(CK) + ") of shape " + shape_str(cols) +
                    " are not divisible by kh*kw = " + std::to_string(KK));
  auto [OH, OW] = out_size(w, H, W, "output_size");
  const ssize_t L = OH * OW;
  if ((nkl && cols.shape(2) != L) || (!nkl && cols.shape(1) != N * L))
    tl::value_error("cols: shape " + shape_str(cols) + " does not match " + std::to_string(OH) + "x" +
                    std::to_string(OW) + " windows of output_size " + pair_str(H, W) + " for batch " +
                    std::to_string(N));
  const ssize_t C = CK / KK;
  const ssize_t bs = nkl ? CK * L : L, rs = nkl ? L : N * L;
  const bool f32 = py::isinstance<py::array_t<float>>(cols);
  py::array x = f32 ? py::array(py::array_t<float>({N, C, H, W})) : py::array(py::array_t<double>({N, C, H, W}));
  const void* src = cols.data();
  void* dst = x.mutable_data();
  {
    py::gil_scoped_release release;
    if (f32)
      col2im_dispatch(version, static_cast<const float*>(src), static_cast<float*>(dst), N, C, H, W, w, OH, OW, bs,
                      rs);
    else
      col2im_dispatch(version, static_cast<const double*>(src), static_cast<double*>(dst), N, C, H, W, w, OH, OW, bs,
                      rs);
  }
  return x;
}

// out[b, a, :] = in[a, b, :] (+ bias[a]): A*B contiguous row copies of L values, threaded over a.
template <typename T>
void transpose01_impl(const T* in, T* out, const T* bias, ssize_t A, ssize_t B, ssize_t L) {
  run_over(A, A * B * L, [&](ssize_t a) {
    for (ssize_t b = 0; b < B; ++b) {
      const T* s = in + (a * B + b) * L;
      T* d = out + (b * A + a) * L;
      if (bias == nullptr) {
        std::memcpy(d, s, sizeof(T) * L);
      } else {
        const T v = bias[a];
        for (ssize_t l = 0; l < L; ++l) d[l] = s[l] + v;
      }
    }
  }, kCopyMinElems);
}

py::array transpose01(const py::array& a, const py::object& bias) {
  if (a.ndim() != 3) tl::value_error("a: expected a 3-D [A, B, L] array, got shape " + shape_str(a));
  check_dtype(a, "a");
  const ssize_t A = a.shape(0), B = a.shape(1), L = a.shape(2);
  const bool f32 = py::isinstance<py::array_t<float>>(a);
  py::array b_arr;
  if (!bias.is_none()) {
    if (!py::isinstance<py::array>(bias)) throw py::type_error("bias: expected a numpy array or None");
    b_arr = py::reinterpret_borrow<py::array>(bias);
    check_dtype(b_arr, "bias");
    if (b_arr.ndim() != 1 || b_arr.shape(0) != A || b_arr.dtype().not_equal(a.dtype()))
      tl::value_error("bias: expected shape (" + std::to_string(A) + ",) and the dtype of a " +
                      std::string(py::str(a.dtype())) + ", got shape " + shape_str(b_arr) + " dtype " +
                      std::string(py::str(b_arr.dtype())));
  }
  py::array out = f32 ? py::array(py::array_t<float>({B, A, L})) : py::array(py::array_t<double>({B, A, L}));
  const void* src = a.data();
  const void* bp = bias.is_none() ? nullptr : b_arr.data();
  void* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    if (f32)
      transpose01_impl(static_cast<const float*>(src), static_cast<float*>(dst), static_cast<const float*>(bp), A, B,
                       L);
    else
      transpose01_impl(static_cast<const double*>(src), static_cast<double*>(dst), static_cast<const double*>(bp), A,
                       B, L);
  }
  return out;
}

// STREAM "copy" (dst = src) on the im2col threads, 64 KiB chunks handed out dynamically: the practical bandwidth
// roof for a copy-like kernel on this machine. Returns nothing; the caller times it and counts 2 * nbytes.
void stream_copy(py::array& dst, const py::array& src) {
  if (!(src.flags() & py::array::c_style) || !(dst.flags() & py::array::c_style) || !dst.writeable())
    tl::value_error("dst/src: must be C-contiguous (dst writeable), got shapes " + shape_str(dst) + ", " +
                    shape_str(src));
  if (dst.nbytes() != src.nbytes())
    tl::value_error("dst: " + std::to_string(dst.nbytes()) + " bytes, src " + std::to_string(src.nbytes()) +
                    " bytes: sizes differ");
  const ssize_t n = src.nbytes(), chunk = ssize_t(1) << 16;
  const char* s = static_cast<const char*>(src.data());
  char* d = static_cast<char*>(dst.mutable_data());
  py::gil_scoped_release release;
  run_over((n + chunk - 1) / chunk, n / ssize_t(sizeof(float)), [&](ssize_t c) {
    const ssize_t off = c * chunk;
    std::memcpy(d + off, s + off, size_t(std::min(chunk, n - off)));
  });
}

}  // namespace

TL_REGISTER(conv) {
  m.doc() = "im2col / col2im (layout of torch.nn.functional.unfold / fold), float32/float64, versions v0 (OpenMP "
            "over N*C) and v1 (streaming, threads over channels x kernel rows); transpose01, stream_copy; "
            "conv2d_forward / conv2d_backward_weight: the v2 implicit GEMM (no column matrix)";
  m.def("im2col", &im2col, py::arg("x"), py::arg("kernel_size"), py::arg("stride"), py::arg("padding"),
        py::arg("dilation"), py::arg("layout") = "NKL", py::arg("version") = "v1", py::arg("out") = py::none(),
        "x [N,C,H,W] C-contiguous -> cols [N, C*kh*kw, OH*OW] (NKL) or [C*kh*kw, N*OH*OW] (KNL)");
  m.def("col2im", &col2im, py::arg("cols"), py::arg("output_size"), py::arg("kernel_size"), py::arg("stride"),
        py::arg("padding"), py::arg("dilation"), py::arg("layout") = "NKL", py::arg("batch") = 0,
        py::arg("version") = "v1",
        "cols [N, C*kh*kw, L] (NKL) or [C*kh*kw, batch*L] (KNL) -> x [N,C,H,W], overlaps summed");
  m.def("transpose01", &transpose01, py::arg("a"), py::arg("bias") = py::none(),
        "a [A, B, L] C-contiguous -> [B, A, L] (+ bias[A] broadcast), threaded row copies");
  m.def("stream_copy", &stream_copy, py::arg("dst"), py::arg("src"),
        "dst[:] = src (same byte size, C-contiguous), threaded 64 KiB memcpy chunks: STREAM copy");
}
