// conv_im2col.cpp — im2col / col2im for tinylearn.conv (backend="cpp"), layout of torch.nn.functional.unfold/fold.
//
//   cols[n, (c*kh + i)*kw + j, oh*OW + ow] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]   (0 outside)
//   col2im is the adjoint: x[n, c, ih, iw] += cols[...] over all (i, j, oh, ow) that read (ih, iw).
//
// Versions:
// Layouts: "NKL" = unfold's [N, K, L]; "KNL" = [K, N*L], the whole batch as one GEMM operand (conv2d uses it:
// one [OC, K] x [K, N*L] GEMM is ~5x faster in OpenBLAS than N GEMMs of [OC, K] x [K, L] on this size class).
//   im2col   OpenMP over the N*C image planes; per (i, j, oh) one output row of OW values. stride 1 copies the
//            valid span with memcpy (contiguous inner copy) and zero-fills the padded edges; other strides
//            gather with a unit-stride write. Planes are handed out dynamically (robust on a shared machine).
//   col2im   OpenMP over N*C (each plane is owned by one thread: no atomics). For every pixel the additions
//            happen in ascending (i, j) order, the order of torch's CPU fold -> bit-identical fp32 results.
// float32 and float64. All arguments are validated (ValueError naming the argument and shape) before any memory
// is touched; inputs must be C-contiguous (the Python wrapper makes them so). Checked against numpy and torch in
// tests/test_conv_im2col.py.
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

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

bool parse_layout(const std::string& layout) {
  if (layout == "NKL") return true;
  if (layout != "KNL") tl::value_error("layout: expected 'NKL' or 'KNL', got '" + layout + "'");
  return false;
}

py::array im2col(const py::array& x, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
                 std::pair<ssize_t, ssize_t> p, std::pair<ssize_t, ssize_t> d, const std::string& layout) {
  if (x.ndim() != 4) tl::value_error("x: expected a 4-D [N, C, H, W] array, got shape " + shape_str(x));
  check_dtype(x, "x");
  const bool nkl = parse_layout(layout);
  const Win w = make_win(k, s, p, d);
  const ssize_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  auto [OH, OW] = out_size(w, H, W, "input");
  const ssize_t K = C * w.kh * w.kw, L = OH * OW;
  const bool f32 = py::isinstance<py::array_t<float>>(x);
  std::vector<ssize_t> shape = nkl ? std::vector<ssize_t>{N, K, L} : std::vector<ssize_t>{K, N * L};
  py::array cols = f32 ? py::array(py::array_t<float>(shape)) : py::array(py::array_t<double>(shape));
  const ssize_t bs = nkl ? K * L : L, rs = nkl ? L : N * L;
  const void* src = x.data();
  void* dst = cols.mutable_data();
  {
    py::gil_scoped_release release;
    if (f32)
      im2col_impl(static_cast<const float*>(src), static_cast<float*>(dst), N, C, H, W, w, OH, OW, bs, rs);
    else
      im2col_impl(static_cast<const double*>(src), static_cast<double*>(dst), N, C, H, W, w, OH, OW, bs, rs);
  }
  return cols;
}

py::array col2im(const py::array& cols, std::pair<ssize_t, ssize_t> output_size, std::pair<ssize_t, ssize_t> k,
                 std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> p, std::pair<ssize_t, ssize_t> d,
                 const std::string& layout, ssize_t batch) {
  const bool nkl = parse_layout(layout);
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
      col2im_impl(static_cast<const float*>(src), static_cast<float*>(dst), N, C, H, W, w, OH, OW, bs, rs);
    else
      col2im_impl(static_cast<const double*>(src), static_cast<double*>(dst), N, C, H, W, w, OH, OW, bs, rs);
  }
  return x;
}

}  // namespace

TL_REGISTER(conv) {
  m.doc() = "im2col / col2im (layout of torch.nn.functional.unfold / fold), float32/float64, OpenMP over N*C";
  m.def("im2col", &im2col, py::arg("x"), py::arg("kernel_size"), py::arg("stride"), py::arg("padding"),
        py::arg("dilation"), py::arg("layout") = "NKL",
        "x [N,C,H,W] C-contiguous -> cols [N, C*kh*kw, OH*OW] (NKL) or [C*kh*kw, N*OH*OW] (KNL)");
  m.def("col2im", &col2im, py::arg("cols"), py::arg("output_size"), py::arg("kernel_size"), py::arg("stride"),
        py::arg("padding"), py::arg("dilation"), py::arg("layout") = "NKL", py::arg("batch") = 0,
        "cols [N, C*kh*kw, L] (NKL) or [C*kh*kw, batch*L] (KNL) -> x [N,C,H,W], overlaps summed");
}
