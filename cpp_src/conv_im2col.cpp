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
//       (an 8x32 / 8x16 AVX-512 one here, gemm.cpp's via gemm_ukr.h at the other levels) with B panels packed
//       straight from the image (AVX-512: masked row-segment loads for stride 1), one OpenMP team. See below.
// Also here: transpose01 (swap the two leading axes of [A, B, L] with an optional bias per A: the KNL GEMM output
// [OC, N, L] -> NCHW, and dY NCHW -> [OC, N*L]) and stream_copy (the STREAM "copy" kernel on the same threads,
// the bandwidth roof im2col is compared against).
// float32 and float64. All arguments are validated (ValueError naming the argument and shape) before any memory
// is touched; inputs must be C-contiguous (the Python wrapper makes them so). Checked against numpy and torch in
// tests/test_conv_im2col.py.
#include <immintrin.h>

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
#include "conv_direct.h"
#include "gemm_ukr.h"
#include "simd_transpose.h"
#include "simd_ukr.h"

namespace py = pybind11;

namespace {

struct Win {
  ssize_t kh, kw, sh, sw, ph, pw, dh, dw;
};

std::string pair_str(ssize_t a, ssize_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

using tl::shape_str;

Win make_win(std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> p,
             std::pair<ssize_t, ssize_t> d) {
  if (k.first < 1 || k.second < 1) tl::value_error("kernel_size: must be positive, got " + pair_str(k.first, k.second));
  if (s.first < 1 || s.second < 1) tl::value_error("stride: must be positive, got " + pair_str(s.first, s.second));
  if (d.first < 1 || d.second < 1) tl::value_error("dilation: must be positive, got " + pair_str(d.first, d.second));
  if (p.first < 0 || p.second < 0) tl::value_error("padding: must be non-negative, got " + pair_str(p.first, p.second));
  return {k.first, k.second, s.first, s.second, p.first, p.second, d.first, d.second};
}

// Output size; raises when the dilated kernel does not fit in the padded input.
std::pair<ssize_t, ssize_t> out_size(const Win& w, ssize_t H, ssize_t W, const char* what) {
  const ssize_t eh = w.dh * (w.kh - 1) + 1, ew = w.dw * (w.kw - 1) + 1;
  if (eh > H + 2 * w.ph || ew > W + 2 * w.pw)
    tl::value_error(std::string("kernel_size: dilated kernel ") + pair_str(eh, ew) + " is larger than the padded " +
                    what + " " + pair_str(H + 2 * w.ph, W + 2 * w.pw));
  return {(H + 2 * w.ph - eh) / w.sh + 1, (W + 2 * w.pw - ew) / w.sw + 1};
}

void check_dtype(const py::array& a, const char* name) {
  if (!(py::isinstance<py::array_t<float>>(a) || py::isinstance<py::array_t<double>>(a)))
    throw py::type_error(std::string(name) + ": expected float32 or float64, got dtype " +
                         std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    tl::value_error(std::string(name) + ": must be C-contiguous, got shape " + shape_str(a));
}

// Below this many copied elements a parallel region costs more than it saves (thread wake-up, and on a
// loaded machine whole scheduler slices): small layers such as the digits CNN run single-threaded.
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

// Valid output range [lo, hi) of one axis for kernel tap offset `off` (= tap*dil - pad): 0 <= o*s + off < size.
inline std::pair<ssize_t, ssize_t> valid_range(ssize_t off, ssize_t s, ssize_t size, ssize_t out) {
  ssize_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
  ssize_t hi = size - off <= 0 ? 0 : (size - off - 1) / s + 1;
  hi = std::min(hi, out);
  lo = std::min(lo, hi);
  return {lo, hi};
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


// ------------------------------------------------------------------------------------- v2: implicit-GEMM conv2d
// The forward without a column matrix. Per group g the conv is Y_n[OCg, L] = W_g[OCg, Kg] @ cols_n[Kg, L]; the GEMM
// runs on packed micro-kernels (conv_micro_kernel: 8x32 / 8x16 AVX-512 here, else gemm.cpp's via gemm_ukr.h) and B
// is packed straight from the image: a tile of whole NR-column panels of output positions (the batch side by side),
// KC kernel rows at a time, goes into NR-column micro-panels (the layout pack_b produces) by row segments (AVX-512,
// stride 1: pack_b_implicit_avx512's masked loads; else pack_b_implicit's memset / copy / gather), so the "columns"
// only ever exist as one L2-resident KC x NC block per thread. A (the weights) is packed once per call into MR-row
// micro-panels per KC block, shared by all threads and all images. The micro-kernel accumulates into y[n] itself
// (ldc = L, NCHW: no transpose), whose tile starts as the bias. One OpenMP team does everything (A packing, then
// tiles (g, panel range) dynamically): no OpenBLAS threads, no std::threads, so nothing spins against anything else
// between the stages of one conv.
struct FreeDeleter {
  void operator()(void* q) const { std::free(q); }
};
template <class T>
std::unique_ptr<T[], FreeDeleter> aligned_array(size_t n) {  // 64-byte aligned (the micro-kernel loads B aligned)
  void* q = std::aligned_alloc(64, ((n * sizeof(T) + 63) / 64) * 64 + 64);
  if (!q) throw std::bad_alloc();
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(q));
}

template <class T>
struct ImplicitRows {  // per kernel row k = (c, i, j) of one group: where it reads
  std::vector<ssize_t> coff, ioff, joff, lo, hi;  // channel offset (c*H*W), i*dh - ph, j*dw - pw, valid ow range

  // the K = C*kh*kw rows of a window w over an H x W image with OW output columns
  ImplicitRows(ssize_t K, const Win& w, ssize_t H, ssize_t W, ssize_t OW) {
    for (auto* v : {&coff, &ioff, &joff, &lo, &hi}) v->resize(size_t(K));
    const ssize_t KK = w.kh * w.kw;
    for (ssize_t k = 0; k < K; ++k) {
      const ssize_t c = k / KK, i = (k % KK) / w.kw, j = k % w.kw;
      coff[k] = c * H * W;
      ioff[k] = i * w.dh - w.ph;
      joff[k] = j * w.dw - w.pw;
      std::tie(lo[k], hi[k]) = valid_range(joff[k], w.sw, W, OW);
    }
  }
};

template <int SW, class T>
void pack_b_implicit(const T* xg, ssize_t xs, const Win& w, ssize_t H, ssize_t W, ssize_t OH, ssize_t OW,
                     const ImplicitRows<T>& rows, ssize_t p0, ssize_t kc, ssize_t j0, ssize_t nc, ssize_t NR, T* Bp) {
  const ssize_t npan = (nc + NR - 1) / NR, ncp = npan * NR;
  for (ssize_t kk = 0; kk < kc; ++kk) {
    const ssize_t k = p0 + kk;
    const ssize_t ioff = rows.ioff[k], joff = rows.joff[k], lo = rows.lo[k], hi = rows.hi[k];
    T* base = Bp + kk * NR;
    // put cnt values of tile positions [pos, pos+cnt) (src == nullptr: zeros; else src[q*SW]) into the panels
    auto put = [&](ssize_t pos, ssize_t cnt, const T* src, ssize_t sw) {
      while (cnt > 0) {
        const ssize_t q = pos / NR, off = pos - q * NR, m = std::min(cnt, NR - off);
        T* d = base + q * kc * NR + off;
        if (src == nullptr) {
          std::memset(d, 0, sizeof(T) * m);
        } else if constexpr (SW == 1) {
          std::memcpy(d, src, sizeof(T) * m);
          src += m;
        } else {
          const ssize_t st = SW > 0 ? SW : sw;
          for (ssize_t t = 0; t < m; ++t) d[t] = src[t * st];
          src += m * st;
        }
        pos += m;
        cnt -= m;
      }
    };
    const ssize_t L = OH * OW;
    ssize_t n = j0 / L, oh = (j0 % L) / OW, ow = (j0 % L) % OW, pos = 0;
    const T* plane = xg + n * xs + rows.coff[k];
    while (pos < nc) {
      const ssize_t seg = std::min(OW - ow, nc - pos);  // positions ow .. ow+seg-1 of output row oh
      const ssize_t ih = oh * w.sh + ioff;
      if (ih < 0 || ih >= H) {
        put(pos, seg, nullptr, 0);
      } else {
        const ssize_t a = std::clamp(lo, ow, ow + seg), b = std::clamp(hi, a, ow + seg);
        if (a > ow) put(pos, a - ow, nullptr, 0);
        if (b > a) put(pos + (a - ow), b - a, plane + ih * W + a * w.sw + joff, w.sw);
        if (ow + seg > b) put(pos + (b - ow), ow + seg - b, nullptr, 0);
      }
      pos += seg;
      ow = 0;
      if (++oh == OH) {  // the tile continues in the next image of the batch
        oh = 0;
        plane += xs;
      }
    }
    if (ncp > nc) put(nc, ncp - nc, nullptr, 0);  // zero columns of the last panel
  }
}

// The tile's positions [j0, j0+nc) cut into the NR-column panels and, inside a panel, at output-row (and image)
// boundaries: segment = `cnt` consecutive output columns ow0.. of row oh of image img, at panel lanes d..d+cnt-1.
// The cut does not depend on the kernel row k, so the AVX-512 packer computes it once per tile.
struct PanelSeg {
  ssize_t img, oh, ow0;
  int d, cnt;
};

inline void tile_segments(ssize_t j0, ssize_t nc, ssize_t NR, ssize_t L, ssize_t OW, std::vector<PanelSeg>& segs,
                          std::vector<ssize_t>& start) {
  segs.clear();
  start.clear();
  for (ssize_t pos = 0; pos < nc;) {
    if (pos % NR == 0) start.push_back(ssize_t(segs.size()));
    const ssize_t j = j0 + pos, img = j / L, l = j % L, oh = l / OW, ow = l % OW;
    const ssize_t cnt = std::min({OW - ow, NR - pos % NR, nc - pos});
    segs.push_back({img, oh, ow, int(pos % NR), int(cnt)});
    pos += cnt;
  }
  start.push_back(ssize_t(segs.size()));
}

// AVX-512 B packer for stride 1 (the avx512 micro-kernels: NR = 2 vectors, 32 fp32 / 16 fp64). Per kernel row k
// and panel the NR values are assembled in two registers, one masked load per segment and half (a masked load
// from src - d puts src[0..cnt) at lanes d..d+cnt; lanes in the padding or outside the segment stay zero and,
// being masked, never touch memory), then two aligned stores: no memset / memcpy calls, no per-element branches.
// Same result as pack_b_implicit, which the scalar / AVX2 paths and other strides keep using (a masked-gather
// version for stride 2 measured slower than its scalar strided copy on the 7x7/2 stem).
// fp32 / fp64 overloads of the three vector operations (target functions: a portable build still has them)
struct Pk512F {
  using V = __m512;
  static constexpr int LANES = 16;
};
struct Pk512D {
  using V = __m512d;
  static constexpr int LANES = 8;
};
template <class T>
using Pk512 = std::conditional_t<std::is_same_v<T, float>, Pk512F, Pk512D>;
__attribute__((target("avx512f"))) inline void pk_zero(__m512& r) { r = _mm512_setzero_ps(); }
__attribute__((target("avx512f"))) inline void pk_zero(__m512d& r) { r = _mm512_setzero_pd(); }
// lanes of m: p[lane]
__attribute__((target("avx512f"))) inline void pk_load(__m512& r, uint32_t m, const float* p) {
  r = _mm512_mask_loadu_ps(r, __mmask16(m), p);
}
__attribute__((target("avx512f"))) inline void pk_load(__m512d& r, uint32_t m, const double* p) {
  r = _mm512_mask_loadu_pd(r, __mmask8(m), p);
}
__attribute__((target("avx512f"))) inline void pk_store(float* d, __m512 r) { _mm512_store_ps(d, r); }
__attribute__((target("avx512f"))) inline void pk_store(double* d, __m512d r) { _mm512_store_pd(d, r); }

template <class T>
__attribute__((target("avx512f"))) void pack_b_implicit_avx512(const T* xg, ssize_t xs, const Win& w, ssize_t H,
                                                               ssize_t W, const ImplicitRows<T>& rows, ssize_t p0,
                                                               ssize_t kc, const PanelSeg* segs, const ssize_t* start,
                                                               ssize_t npan, T* Bp) {
  using V = typename Pk512<T>::V;
  constexpr int LANES = Pk512<T>::LANES, NR = 2 * LANES;
  for (ssize_t kk = 0; kk < kc; ++kk) {
    const ssize_t k = p0 + kk;
    const ssize_t ioff = rows.ioff[k], lo = rows.lo[k], hi = rows.hi[k];
    const T* xk = xg + rows.coff[k] + rows.joff[k];
    for (ssize_t q = 0; q < npan; ++q) {
      V r0, r1;
      pk_zero(r0);
      pk_zero(r1);
      for (ssize_t e = start[q]; e < start[q + 1]; ++e) {
        const PanelSeg& sg = segs[e];
        const ssize_t ih = sg.oh * w.sh + ioff;
        if (ih < 0 || ih >= H) continue;
        const ssize_t a = std::max<ssize_t>(lo - sg.ow0, 0), b = std::min<ssize_t>(hi - sg.ow0, sg.cnt);
        if (a >= b) continue;
        const uint64_t m = ((uint64_t(1) << (sg.d + b)) - 1) & ~((uint64_t(1) << (sg.d + a)) - 1);
        // lane d + t reads the input element of output column ow0 + t: base[d + t] (base may lie before the
        // array: only the masked lanes, all inside it, are read)
        const uintptr_t base = uintptr_t(xk + sg.img * xs + ih * W + sg.ow0) - uintptr_t(sg.d * ssize_t(sizeof(T)));
        if (m & ((uint64_t(1) << LANES) - 1)) pk_load(r0, uint32_t(m), reinterpret_cast<const T*>(base));
        if (m >> LANES) pk_load(r1, uint32_t(m >> LANES), reinterpret_cast<const T*>(base + LANES * sizeof(T)));
      }
      T* dst = Bp + q * kc * NR + kk * NR;
      pk_store(dst, r0);
      pk_store(dst + LANES, r1);
    }
  }
}

template <class T>
tl::GemmMicroKernel<T> micro_kernel();
template <>
tl::GemmMicroKernel<float> micro_kernel<float>() { return tl::gemm_micro_kernel_f32(); }
template <>
tl::GemmMicroKernel<double> micro_kernel<double>() { return tl::gemm_micro_kernel_f64(); }

// The forward's own AVX-512 micro-kernels, 8 rows x 2 vectors (8x32 fp32, 8x16 fp64), same contract as gemm.cpp's
// 6-row ones (c[i*ldc + j] += sum_k a[k*8 + i] * b[k*NR + j]). 8 rows because conv layers have 2^n output
// channels: 64 / 128 / 256 are whole 8-row panels (6-row panels leave an edge panel that runs through the scratch
// tile and wastes a third of its FMAs), and per k 16 FMAs share the 2 B loads instead of 12. 16 accumulators +
// 2 B vectors + 1 broadcast = 19 of the 32 zmm registers. The body is simd_ukr.h's.
TL_UKR_DEFINE(conv_ukr_avx512_f32_8x32, "avx512f", float, TL_AVX512_F32, 8)
TL_UKR_DEFINE(conv_ukr_avx512_f64_8x16, "avx512f", double, TL_AVX512_F64, 8)

// The forward's kernel: the 8-row AVX-512 one where gemm.cpp's dispatch (TINYLEARN_CPU_FEATURES) picks avx512,
// else gemm.cpp's (avx2 6x16 / 6x8, scalar).
template <class T>
tl::GemmMicroKernel<T> conv_micro_kernel() {
  tl::GemmMicroKernel<T> k = micro_kernel<T>();
  if (std::string(k.isa) != "avx512") return k;
  if constexpr (std::is_same_v<T, float>)
    return {conv_ukr_avx512_f32_8x32, 8, 32, k.isa};
  else
    return {conv_ukr_avx512_f64_8x16, 8, 16, k.isa};
}

// Below this many multiply-adds the conv runs on the calling thread (a team costs more than it saves).
constexpr double kParallelMinMacs = 4e6;

// conv2d_forward / conv2d_backward_weight's version argument
void check_kernel_version(const std::string& version) {
  if (version != "v2" && version != "v3")
    tl::value_error("version: expected 'v2' (implicit GEMM) or 'v3' (direct where it applies), got '" + version + "'");
}

template <class T>
void conv2d_implicit(const T* x, const T* wt, const T* bias, T* y, ssize_t N, ssize_t C, ssize_t H, ssize_t W,
                     ssize_t OC, ssize_t G, const Win& w, ssize_t OH, ssize_t OW, bool flip = false) {
  const tl::GemmMicroKernel<T> kn = conv_micro_kernel<T>();
  const ssize_t MR = kn.MR, NR = kn.NR, KK = w.kh * w.kw, Cg = C / G, OCg = OC / G, Kg = Cg * KK, L = OH * OW;
  // KC: at most 256 kernel rows per block, the blocks balanced (K = 576 -> 2 x 288, not 256 + 256 + 64)
  const ssize_t KC = Kg <= 0 ? 1 : (Kg + (Kg + 255) / 256 - 1) / ((Kg + 255) / 256);
  const ssize_t OCp = (OCg + MR - 1) / MR * MR;
  // tile width: up to 8 NR-panels (a KC x NC block of B: 256 KB fp32 on AVX-512, in L2), no wider than the image
  // Columns: the whole batch side by side (N*L per group, as in the KNL layout), cut into tiles of up to 8
  // NR-panels (a KC x NC block of B: 256 KB fp32 on AVX-512, in L2). A tile or panel may span two images: only
  // a panel that does (or a ragged edge) goes through the scratch tile, so a 14x14 map wastes no half-empty panel.
  // With few columns (256->256 @14: 784 per group) the tiles shrink to give each thread >= 4 of them: 3 tiles of
  // 256 on 2 threads would leave one thread idle a third of the time.
  const ssize_t NL = N * L;
  const double macs = double(N) * OC * L * Kg;
  const int nt = macs >= kParallelMinMacs ? tl::n_threads() : 1;
  // Tiles: runs of whole NR-panels, at most 8 per tile; tile t of a group holds panels [P*t/ntj, P*(t+1)/ntj).
  // Threaded, each thread gets >= 4 tiles and the tile count is a multiple of the threads, so the dynamic schedule
  // ends even (784 columns = 24.5 panels on 2 threads: 8 tiles of 3-4 panels, not 4 + 3 tiles of 4).
  const ssize_t P = (NL + NR - 1) / NR;
  ssize_t ntj = (P + 7) / 8;
  if (nt > 1) {
    ntj = std::max<ssize_t>(ntj, (4 * nt + G - 1) / G);
    while ((G * ntj) % nt != 0 && ntj < P) ++ntj;
    ntj = std::min(ntj, P);
  }
  const ssize_t NC = (P + ntj - 1) / ntj * NR;  // the widest tile
  const ssize_t ntiles = G * ntj;
  // the AVX-512 packer for stride 1 (other strides: its gathers measured slower than the scalar strided copy)
  const bool fast_pack = std::string(kn.isa) == "avx512" && NR == 64 / ssize_t(sizeof(T)) * 2 && w.sw == 1;
  const ImplicitRows<T> rows(Kg, w, H, W, OW);
  auto Ap = aligned_array<T>(size_t(G * OCp * Kg));  // [g][pc block][OCp/MR panels][kc][MR]
  // per-thread B blocks, allocated here: an exception must not leave an OpenMP region
  std::vector<std::unique_ptr<T[], FreeDeleter>> Bps;
  for (int t = 0; t < nt; ++t) Bps.push_back(aligned_array<T>(size_t(std::min(KC, Kg) * NC)));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    // pack A: panel (g, pc, ir) at g*OCp*Kg + pc*OCp + ir*kc holds W[g*OCg + ir + r, pc + kk] at [kk*MR + r]
    const ssize_t nkb = (Kg + KC - 1) / KC, npa = OCp / MR;
#pragma omp for schedule(static)
    for (ssize_t t = 0; t < G * nkb * npa; ++t) {
      const ssize_t g = t / (nkb * npa), pb = (t / npa) % nkb, ir = (t % npa) * MR;
      const ssize_t pc = pb * KC, kc = std::min(KC, Kg - pc), rows_v = std::min(MR, OCg - ir);
      T* d = Ap.get() + g * OCp * Kg + pc * OCp + ir * kc;
      if (!flip) {  // row by row: contiguous reads of W, MR-strided writes inside the (L1-resident) panel
        for (ssize_t r = 0; r < MR; ++r) {
          const T* src = wt + (g * OCg + ir + r) * Kg + pc;
          if (r < rows_v)
            for (ssize_t kk = 0; kk < kc; ++kk) d[kk * MR + r] = src[kk];
          else
            for (ssize_t kk = 0; kk < kc; ++kk) d[kk * MR + r] = T(0);
        }
      } else {  // row o of group g, column (c, tap t): W[g*Cg + c, o, KK-1-t] of the weight [C, OCg, kh, kw];
                // per c the panel's rows x taps are one contiguous MR*KK block of W
        ssize_t c = pc / KK, t = pc - c * KK;
        for (ssize_t kk = 0; kk < kc; ++kk, d += MR) {
          const T* src = wt + ((g * Cg + c) * OCg + ir) * KK + (KK - 1 - t);
          for (ssize_t r = 0; r < rows_v; ++r) d[r] = src[r * KK];
          for (ssize_t r = rows_v; r < MR; ++r) d[r] = T(0);
          if (++t == KK) t = 0, ++c;
        }
      }
    }
    T* const Bp = Bps[size_t(tl::thread_id())].get();
    alignas(64) T tile[8 * 32];  // MR x NR of the widest kernel
    std::vector<PanelSeg> segs;
    std::vector<ssize_t> seg_start;
#pragma omp for schedule(dynamic, 1)
    for (ssize_t t = 0; t < ntiles; ++t) {
      const ssize_t g = t / ntj, tj = t % ntj;
      const ssize_t j0 = P * tj / ntj * NR, nc = std::min(P * (tj + 1) / ntj * NR, NL) - j0;
      if (fast_pack) tile_segments(j0, nc, NR, L, OW, segs, seg_start);
      const T* xg = x + g * Cg * H * W;
      T* yg = y + g * OCg * L;  // column j of the group: y[n, g*OCg + o, l] at yg + o*L + (j/L)*OC*L + j%L
      auto col_off = [&](ssize_t j) { return (j / L) * OC * L + j % L; };
      for (ssize_t j = j0; j < j0 + nc;) {  // the tile starts as the bias, one image segment at a time
        const ssize_t m = std::min(j0 + nc - j, L - j % L);
        T* yt = yg + col_off(j);
        for (ssize_t o = 0; o < OCg; ++o) std::fill(yt + o * L, yt + o * L + m, bias ? bias[g * OCg + o] : T(0));
        j += m;
      }
      for (ssize_t pc = 0; pc < Kg; pc += KC) {
        const ssize_t kc = std::min(KC, Kg - pc);
        if (fast_pack)
          pack_b_implicit_avx512(xg, C * H * W, w, H, W, rows, pc, kc, segs.data(), seg_start.data(),
                                 ssize_t(seg_start.size()) - 1, Bp);
        else if (w.sw == 1)
          pack_b_implicit<1>(xg, C * H * W, w, H, W, OH, OW, rows, pc, kc, j0, nc, NR, Bp);
        else if (w.sw == 2)
          pack_b_implicit<2>(xg, C * H * W, w, H, W, OH, OW, rows, pc, kc, j0, nc, NR, Bp);
        else
          pack_b_implicit<0>(xg, C * H * W, w, H, W, OH, OW, rows, pc, kc, j0, nc, NR, Bp);
        const T* Ab = Ap.get() + g * OCp * Kg + pc * OCp;
        for (ssize_t jr = 0; jr < nc; jr += NR) {
          const ssize_t nr = std::min(NR, nc - jr), j = j0 + jr;
          const bool one_image = j / L == (j + nr - 1) / L;
          T* c0 = yg + col_off(j);
          const T* b = Bp + jr * kc;
          for (ssize_t ir = 0; ir < OCg; ir += MR) {
            const ssize_t mr = std::min(MR, OCg - ir);
            const T* a = Ab + ir * kc;
            if (mr == MR && nr == NR && one_image) {
              kn.ukr(kc, a, b, c0 + ir * L, L);
            } else {  // edge or image-spanning panel: the full MR x NR into scratch, add the valid part
              std::fill(tile, tile + MR * NR, T(0));
              kn.ukr(kc, a, b, tile, NR);
              for (ssize_t q = 0; q < nr;) {  // one image segment at a time
                const ssize_t m = std::min(nr - q, L - (j + q) % L);
                T* c = yg + col_off(j + q) + ir * L;
                for (ssize_t i = 0; i < mr; ++i)
                  for (ssize_t u = 0; u < m; ++u) c[i * L + u] += tile[i * NR + q + u];
                q += m;
              }
            }
          }
        }
      }
    }
  }
}

// conv2d forward (v2): x [N, C, H, W], weight [OC, C/groups, kh, kw], bias [OC] or None -> y [N, OC, OH, OW].
// flip_weight: `weight` is [C, OC/groups, kh, kw] and the conv uses W~[g*OCg + o, c, i, j] =
// weight[g*Cg + c, o, kh-1-i, kw-1-j] (the transposed, flipped kernel of dX = conv(dY, W~)), read that way by the A
// packing: no flipped copy of the weights is made.
py::array conv2d_forward_v2(const py::array& x, const py::array& wt, const py::object& bias,
                            std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> p,
                            std::pair<ssize_t, ssize_t> d, ssize_t groups, bool flip_weight,
                            const std::string& version) {
  check_kernel_version(version);
  if (x.ndim() != 4) tl::value_error("x: expected a 4-D [N, C, H, W] array, got shape " + shape_str(x));
  if (wt.ndim() != 4)
    tl::value_error("weight: expected a 4-D [OC, C/groups, kh, kw] array, got shape " + shape_str(wt));
  check_dtype(x, "x");
  check_dtype(wt, "weight");
  if (wt.dtype().not_equal(x.dtype()))
    throw py::type_error("weight: dtype " + std::string(py::str(wt.dtype())) + " differs from x's " +
                         std::string(py::str(x.dtype())));
  const ssize_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  if (groups < 1) tl::value_error("groups: must be >= 1, got " + std::to_string(groups));
  const ssize_t OC = flip_weight ? wt.shape(1) * groups : wt.shape(0);
  const ssize_t Cw = flip_weight ? wt.shape(0) : wt.shape(1) * groups;  // input channels the weight implies
  if (C % groups != 0 || OC % groups != 0 || Cw != C)
    tl::value_error("groups: " + std::to_string(groups) + " does not fit x shape " + shape_str(x) +
                    " and weight shape " + shape_str(wt) + (flip_weight ? " (flip_weight: [C, OC/groups, kh, kw])" : ""));
  const Win w = make_win({wt.shape(2), wt.shape(3)}, s, p, d);
  auto [OH, OW] = out_size(w, H, W, "input");
  py::array b_arr;
  if (!bias.is_none()) {
    if (!py::isinstance<py::array>(bias)) throw py::type_error("bias: expected a numpy array or None");
    b_arr = py::reinterpret_borrow<py::array>(bias);
    check_dtype(b_arr, "bias");
    if (b_arr.ndim() != 1 || b_arr.shape(0) != OC || b_arr.dtype().not_equal(x.dtype()))
      tl::value_error("bias: expected shape (" + std::to_string(OC) + ",) and dtype " +
                      std::string(py::str(x.dtype())) + ", got shape " + shape_str(b_arr) + " dtype " +
                      std::string(py::str(b_arr.dtype())));
  }
  const bool f32 = py::isinstance<py::array_t<float>>(x);
  py::array y = f32 ? py::array(py::array_t<float>({N, OC, OH, OW})) : py::array(py::array_t<double>({N, OC, OH, OW}));
  if (N == 0 || OC == 0 || OH * OW == 0) return y;
  const void *xp = x.data(), *wp = wt.data(), *bp = bias.is_none() ? nullptr : b_arr.data();
  void* yp = y.mutable_data();
  {
    py::gil_scoped_release release;
    const tl::ConvDirectKind direct = f32 && version == "v3"
                                          ? tl::conv_direct_forward_kind(C, OC, {w.kh, w.kw}, s, d, groups)
                                          : tl::ConvDirectKind::none;
    if (direct == tl::ConvDirectKind::blocked)
      tl::conv2d_direct_f32(static_cast<const float*>(xp), static_cast<const float*>(wp), static_cast<const float*>(bp),
                            static_cast<float*>(yp), N, C, H, W, OC, w.kh, w.kw, w.ph, w.pw, OH, OW, flip_weight);
    else if (direct == tl::ConvDirectKind::plain)
      tl::conv2d_direct_plain_f32(static_cast<const float*>(xp), static_cast<const float*>(wp),
                                  static_cast<const float*>(bp), static_cast<float*>(yp), N, C, H, W, OC, w.kh, w.kw,
                                  s.first, s.second, w.ph, w.pw, OH, OW, flip_weight);
    else if (f32)
      conv2d_implicit(static_cast<const float*>(xp), static_cast<const float*>(wp), static_cast<const float*>(bp),
                      static_cast<float*>(yp), N, C, H, W, OC, groups, w, OH, OW, flip_weight);
    else
      conv2d_implicit(static_cast<const double*>(xp), static_cast<const double*>(wp), static_cast<const double*>(bp),
                      static_cast<double*>(yp), N, C, H, W, OC, groups, w, OH, OW, flip_weight);
  }
  return y;
}


// dW of the v2 path (groups == 1): dW[OC, K] = sum over the N*L output positions j of dY[OC, j] * cols[K, j], a GEMM
// whose reduction is the long axis. The threads split the reduction (contiguous ranges of j, private OC x K
// accumulators summed at the end); per block of KR positions: A = dY's OC rows packed into MR-row panels (reads
// along l, contiguous), B = the KR columns of the column matrix generated in cache by pack_b_implicit (rows of
// cols, contiguous segments of x) and transposed into NR-wide k panels. No column matrix, no transposed dY, no
// OpenBLAS call.
inline int team_size() {
#ifdef TINYLEARN_OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}


template <class T>
void conv2d_dweight_implicit(const T* x, const T* dy, T* dw, ssize_t N, ssize_t C, ssize_t H, ssize_t W, ssize_t OC,
                             const Win& w, ssize_t OH, ssize_t OW) {
  const tl::GemmMicroKernel<T> kn = conv_micro_kernel<T>();
  bool tr16 = false;  // fp32 on AVX-512: 16x16 blocks of the k-panel transpose in registers
  if constexpr (std::is_same_v<T, float>) tr16 = std::string(kn.isa) == "avx512";
  const ssize_t MR = kn.MR, NR = kn.NR, KK = w.kh * w.kw, K = C * KK, L = OH * OW, NL = N * L;
  const ssize_t NK = std::min<ssize_t>(8 * NR, (K + NR - 1) / NR * NR);
  const ssize_t OCp = (OC + MR - 1) / MR * MR;
  const ImplicitRows<T> rows(K, w, H, W, OW);
  // reduction blocks of at most 256 positions, their count a multiple of the threads (equal shares: 784 positions
  // on 2 threads = 4 x 196, not 256 + 256 | 256 + 16)
  const double macs = double(NL) * OC * K;
  ssize_t nblk = (NL + 255) / 256;
  const int nt = int(std::min<ssize_t>(macs >= kParallelMinMacs ? tl::n_threads() : 1, nblk));
  if (nt > 1) nblk = (nblk + nt - 1) / nt * nt;
  const ssize_t KR = (NL + nblk - 1) / nblk;
  // per-thread accumulators and packing buffers, allocated here: an exception must not leave an OpenMP region
  std::vector<std::unique_ptr<T[], FreeDeleter>> acc, Aps, Bps, Rbs;
  for (int t = 0; t < std::max(nt, 1); ++t) {
    acc.push_back(aligned_array<T>(size_t(OC * K)));
    Aps.push_back(aligned_array<T>(size_t(OCp * KR)));
    Bps.push_back(aligned_array<T>(size_t(NK * KR)));
    Rbs.push_back(aligned_array<T>(size_t(NK * KR)));
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = tl::thread_id(), nth = team_size();
    T* Cacc = acc[size_t(tid)].get();
    std::fill(Cacc, Cacc + OC * K, T(0));
    T* const Ap = Aps[size_t(tid)].get();
    T* const Bp = Bps[size_t(tid)].get();
    T* const rowsbuf = Rbs[size_t(tid)].get();
    alignas(64) T tile[8 * 32];  // MR x NR of the widest kernel
    // this thread's blocks: a contiguous range (each block of dY / x is read by one thread only)
    const ssize_t b0 = nblk * tid / nth, b1 = nblk * (tid + 1) / nth;
    for (ssize_t blk = b0; blk < b1; ++blk) {
      const ssize_t j0 = blk * KR, kr = std::min(KR, NL - j0);
      if (kr <= 0) break;
      // A: panel ir holds dY[n(j), ir + r, l(j)] at [jj*MR + r]
      for (ssize_t ir = 0; ir < OCp; ir += MR) {
        T* a = Ap + ir * kr;
        for (ssize_t r = 0; r < MR; ++r) {
          const ssize_t o = ir + r;
          if (o >= OC) {
            for (ssize_t jj = 0; jj < kr; ++jj) a[jj * MR + r] = T(0);
            continue;
          }
          for (ssize_t jj = 0; jj < kr;) {  // one image segment at a time: contiguous along l
            const ssize_t j = j0 + jj, n = j / L, l = j % L, m = std::min(kr - jj, L - l);
            const T* src = dy + (n * OC + o) * L + l;
            for (ssize_t q = 0; q < m; ++q) a[(jj + q) * MR + r] = src[q];
            jj += m;
          }
        }
      }
      for (ssize_t kb = 0; kb < K; kb += NK) {
        const ssize_t nk = std::min(NK, K - kb), npan = (nk + NR - 1) / NR;
        // rows kb .. kb+nk of the column matrix over positions j0 .. j0+kr, row-major [nk][kr] (one "panel")
        if (w.sw == 1)
          pack_b_implicit<1>(x, C * H * W, w, H, W, OH, OW, rows, kb, nk, j0, kr, kr, rowsbuf);
        else if (w.sw == 2)
          pack_b_implicit<2>(x, C * H * W, w, H, W, OH, OW, rows, kb, nk, j0, kr, kr, rowsbuf);
        else
          pack_b_implicit<0>(x, C * H * W, w, H, W, OH, OW, rows, kb, nk, j0, kr, kr, rowsbuf);
        // transpose into NR-wide k panels: panel q holds cols[kb + q*NR + t, j0 + jj] at [jj*NR + t]
        // in 16-position strips: the strip's NR x 16 writes (2 KB fp32) stay in L1
        for (ssize_t q = 0; q < npan; ++q) {
          T* bq = Bp + q * kr * NR;
          const ssize_t tv = std::min(NR, nk - q * NR);  // valid k rows of this panel
          for (ssize_t j0s = 0; j0s < kr; j0s += 16) {
            const ssize_t js = std::min<ssize_t>(16, kr - j0s);
            T* d = bq + j0s * NR;
            if constexpr (std::is_same_v<T, float>) {
              if (tr16 && js == 16 && tv == NR && NR % 16 == 0) {
                for (ssize_t t0 = 0; t0 < NR; t0 += 16)
                  tl::transpose16x16_f32(rowsbuf + (q * NR + t0) * kr + j0s, kr, d + t0, NR);
                continue;
              }
            }
            for (ssize_t t = 0; t < tv; ++t) {
              const T* src = rowsbuf + (q * NR + t) * kr + j0s;
              for (ssize_t u = 0; u < js; ++u) d[u * NR + t] = src[u];
            }
            for (ssize_t t = tv; t < NR; ++t)
              for (ssize_t u = 0; u < js; ++u) d[u * NR + t] = T(0);
          }
        }
        for (ssize_t q = 0; q < npan; ++q) {
          const ssize_t nr = std::min(NR, nk - q * NR);
          const T* b = Bp + q * kr * NR;
          for (ssize_t ir = 0; ir < OC; ir += MR) {
            const ssize_t mr = std::min(MR, OC - ir);
            T* c = Cacc + ir * K + kb + q * NR;
            if (mr == MR && nr == NR) {
              kn.ukr(kr, Ap + ir * kr, b, c, K);
            } else {
              std::fill(tile, tile + MR * NR, T(0));
              kn.ukr(kr, Ap + ir * kr, b, tile, NR);
              for (ssize_t i = 0; i < mr; ++i)
                for (ssize_t jj = 0; jj < nr; ++jj) c[i * K + jj] += tile[i * NR + jj];
            }
          }
        }
      }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (ssize_t e = 0; e < OC * K; ++e) {
      T v = acc[0][size_t(e)];
      for (int t = 1; t < nth; ++t) v += acc[size_t(t)][size_t(e)];
      dw[e] = v;
    }
  }
}

// dW of conv2d (groups = 1) without a column matrix: x [N, C, H, W], dy [N, OC, OH, OW] -> dw [OC, C, kh, kw].
py::array conv2d_backward_weight_v2(const py::array& x, const py::array& dy, std::pair<ssize_t, ssize_t> k,
                                    std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> p,
                                    std::pair<ssize_t, ssize_t> d, const std::string& version) {
  check_kernel_version(version);
  if (x.ndim() != 4) tl::value_error("x: expected a 4-D [N, C, H, W] array, got shape " + shape_str(x));
  if (dy.ndim() != 4) tl::value_error("grad_out: expected a 4-D [N, OC, OH, OW] array, got shape " + shape_str(dy));
  check_dtype(x, "x");
  check_dtype(dy, "grad_out");
  if (dy.dtype().not_equal(x.dtype()))
    throw py::type_error("grad_out: dtype " + std::string(py::str(dy.dtype())) + " differs from x's " +
                         std::string(py::str(x.dtype())));
  const Win w = make_win(k, s, p, d);
  const ssize_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3), OC = dy.shape(1);
  auto [OH, OW] = out_size(w, H, W, "input");
  if (dy.shape(0) != N || dy.shape(2) != OH || dy.shape(3) != OW)
    tl::value_error("grad_out: expected shape (" + std::to_string(N) + ", OC, " + std::to_string(OH) + ", " +
                    std::to_string(OW) + ") for x shape " + shape_str(x) + ", got " + shape_str(dy));
  const bool f32 = py::isinstance<py::array_t<float>>(x);
  py::array dw = f32 ? py::array(py::array_t<float>({OC, C, w.kh, w.kw}))
                     : py::array(py::array_t<double>({OC, C, w.kh, w.kw}));
  void* dp = dw.mutable_data();
  if (N * OH * OW == 0 || OC * C == 0) {
    std::memset(dp, 0, size_t(dw.nbytes()));
    return dw;
  }
  const void *xp = x.data(), *gp = dy.data();
  {
    py::gil_scoped_release release;
    if (f32 && version == "v3" && tl::conv_direct_eligible(C, OC, k, s, d, 1))
      tl::conv2d_direct_dweight_f32(static_cast<const float*>(xp), static_cast<const float*>(gp), static_cast<float*>(dp),
                                    N, C, H, W, OC, w.kh, w.kw, w.ph, w.pw, OH, OW);
    else if (f32)
      conv2d_dweight_implicit(static_cast<const float*>(xp), static_cast<const float*>(gp), static_cast<float*>(dp), N,
                              C, H, W, OC, w, OH, OW);
    else
      conv2d_dweight_implicit(static_cast<const double*>(xp), static_cast<const double*>(gp),
                              static_cast<double*>(dp), N, C, H, W, OC, w, OH, OW);
  }
  return dw;
}

std::string micro_kernel_isa() { return tl::gemm_micro_kernel_f32().isa; }

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
  m.def("conv2d_forward", &conv2d_forward_v2, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"),
        py::arg("padding"), py::arg("dilation"), py::arg("groups") = 1, py::arg("flip_weight") = false,
        py::arg("version") = "v3",
        "v2 implicit-GEMM conv2d forward: x [N,C,H,W], weight [OC,C/g,kh,kw] C-contiguous -> y [N,OC,OH,OW] "
        "(packed micro-kernels, B packed from the image, one OpenMP team); flip_weight=True: weight is "
        "[C,OC/g,kh,kw] and the conv uses its transposed, spatially flipped kernel (dX of a stride-1 conv)");
  m.def("conv2d_backward_weight", &conv2d_backward_weight_v2, py::arg("x"), py::arg("grad_out"),
        py::arg("kernel_size"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("version") = "v3",
        "v2 dW of conv2d (groups=1) without a column matrix: x [N,C,H,W], grad_out [N,OC,OH,OW] C-contiguous -> "
        "dW [OC,C,kh,kw] (reduction over N*OH*OW split across the OpenMP team)");
  m.def("micro_kernel_isa", &micro_kernel_isa, "the ISA of the GEMM micro-kernel conv2d_forward uses now");
  m.def("stream_copy", &stream_copy, py::arg("dst"), py::arg("src"),
        "dst[:] = src (same byte size, C-contiguous), threaded 64 KiB memcpy chunks: STREAM copy");
}
