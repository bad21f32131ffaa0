// quant_int8_strassen.cpp — one level of Strassen's algorithm (1969) on the Winograd int8 kernel (avx2_strassen),
// built on the packed-B ladder (quant_int8_ukr.h: mk_wino, wino_row, NPW; quant_int8_packed.h: wino_lda, kept_i16).
//
// A [M, K] and B [K, N] split into 2 x 2 blocks (index q = 2 * row block + column block: 0 = 11, 1 = 12, 2 = 21,
// 3 = 22). Seven block products replace the eight of the textbook split:
//   M1 = (A11 + A22)(B11 + B22)   M2 = (A21 + A22) B11          M3 = A11 (B12 - B22)    M4 = A22 (B21 - B11)
//   M5 = (A11 + A12) B22          M6 = (A21 - A11)(B11 + B12)   M7 = (A12 - A22)(B21 + B22)
//   C11 = M1 + M4 - M5 + M7   C12 = M3 + M5   C21 = M2 + M4   C22 = M1 - M2 + M3 + M6
// so 7/8 of the multiply-accumulates, for 10 block additions of the operands and 8 of the results.
// Exactness: every step is a ring operation on int32 (mod 2^32: vpaddd and uint32 adds wrap, vpmaddwd's int32 pair
// sums cannot saturate here), so C comes out exact mod 2^32, and |C| < 2^31 makes that C itself. Block sums of
// int8 values (or of uint8 codes minus their zero point) are at most 510 in magnitude; with a B sum (256) the
// kernel's pre-add a + b stays within 766, int16. In floating point the same algebra loses accuracy (the
// operand sums round); in integers it is free of error, which is why it fits here.
//
// B is prepared once (int8_strassen_pack, cached by PackedInt8Weight): the seven B operands, each widened to the
// Winograd layout of widen_block_wino per (64-column panel, ST_KCB block), and their column terms summed over K.
// Per call each row item forms its seven A operands (int16 rows through wino_row) and, per output panel, runs the
// seven products into one tile each and adds the tile with its signs straight into the item's rows of C's four
// blocks (the first product to reach a block stores instead of adding).
#include "quant_int8_packed.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using namespace tl::q8;

// operand and result signs, [product][quadrant]
constexpr int ST_PRODUCTS = 7;
constexpr int8_t ST_SA[ST_PRODUCTS][4] = {{1, 0, 0, 1}, {0, 0, 1, 1}, {1, 0, 0, 0}, {0, 0, 0, 1},
                                          {1, 1, 0, 0}, {-1, 0, 1, 0}, {0, 1, 0, -1}};
constexpr int8_t ST_SB[ST_PRODUCTS][4] = {{1, 0, 0, 1}, {1, 0, 0, 0}, {0, 1, 0, -1}, {-1, 0, 1, 0},
                                          {0, 0, 0, 1}, {1, 1, 0, 0}, {0, 0, 1, 1}};
constexpr int8_t ST_SC[ST_PRODUCTS][4] = {{1, 0, 0, 1}, {0, 0, 1, -1}, {0, 1, 0, 1}, {1, 0, 1, 0},
                                          {-1, 1, 0, 0}, {0, 0, 0, 1}, {1, 0, 0, 0}};
// shapes it takes: blocks of whole k quads and whole 64-column panels
constexpr ssize_t ST_K_MULTIPLE = 8, ST_N_MULTIPLE = 2 * NPW;
// row items of at most 8 row blocks (24 rows; 12 items at M = 512, as many as avx2_wino's): with 16 (6 items) a thread
// descheduled mid-item left the other one idle more often on the loaded 2-core box; unloaded, 8, 12 and 16 ran within
// 2% of each other at 512x1024x1024
constexpr ssize_t ST_ITEM_BLOCKS = 8, ST_ITEM_ROWS = ST_ITEM_BLOCKS * WINO_MR;
// K block of the products (kq): 64, as avx2_wino; measured at 512x1024x1024 on Zen 2, 32 ran the same and 128 3% slower
constexpr ssize_t ST_KCB = 64;

std::string strassen_shape_error(ssize_t M, ssize_t K, ssize_t N) {
  std::string why;
  if (M < 2 || M % 2) why += " M=" + std::to_string(M) + " is not even and >= 2;";
  if (K < ST_K_MULTIPLE || K % ST_K_MULTIPLE) why += " K=" + std::to_string(K) + " is not a multiple of 8;";
  if (N < ST_N_MULTIPLE || N % ST_N_MULTIPLE) why += " N=" + std::to_string(N) + " is not a multiple of 128;";
  return why;
}

// int16 elements of one product's widened B: K4h kq x Nh columns x 4
inline ssize_t st_product_elems(ssize_t K, ssize_t N) { return (K / 8) * (N / 2) * 4; }

// (widened B operands [7][Nh / 64 panels][K4h kq x 256], column terms [7][Nh / 64][64]) from int8 B [K, N]
py::tuple strassen_pack(const py::array& b_in) {
  auto b = as_int8(b_in, "b");
  if (b.ndim() != 2) tl::value_error("int8_strassen_pack: b must be 2-D [K, N], got ndim " + std::to_string(b.ndim()));
  const ssize_t K = b.shape(0), N = b.shape(1);
  if (K < ST_K_MULTIPLE || K % ST_K_MULTIPLE || N < ST_N_MULTIPLE || N % ST_N_MULTIPLE)
    tl::value_error("int8_strassen_pack: b shape (" + std::to_string(K) + ", " + std::to_string(N) +
                    ") needs K a multiple of 8 and N a multiple of 128 (whole k quads and 64-column panels per block)");
  const ssize_t Kh = K / 2, Nh = N / 2, K4h = Kh / 4, NPh = Nh / NPW, per = st_product_elems(K, N);
  // 64-byte aligned (numpy's own buffers are 16-byte aligned: the kernel's B loads would split cache lines, ~20%)
  int16_t* pw = aligned_i16(size_t(ST_PRODUCTS) * per);
  py::capsule owner(pw, [](void* q) { std::free(q); });
  py::array_t<int16_t> wide({ssize_t(ST_PRODUCTS) * per}, {ssize_t(sizeof(int16_t))}, pw, owner);
  py::array_t<i32> terms({ssize_t(ST_PRODUCTS) * NPh * NPW});
  i32* pt = terms.mutable_data();
  const i8* pb = b.data();
  {
    py::gil_scoped_release release;
#pragma omp parallel for schedule(static) collapse(2)
    for (int i = 0; i < ST_PRODUCTS; ++i)
      for (ssize_t p = 0; p < NPh; ++p) {
        int16_t* panel = pw + i * per + p * K4h * 256;
        uint32_t cc[NPW] = {};
        for (ssize_t k0 = 0; k0 < K4h; k0 += ST_KCB) {
          const ssize_t k1 = std::min(K4h, k0 + ST_KCB), n = k1 - k0;
          int16_t* blk = panel + k0 * 256;
          for (ssize_t kq = k0; kq < k1; ++kq)
            for (int c = 0; c < NPW; ++c) {
              int16_t v[4];
              for (int u = 0; u < 4; ++u) {
                int s = 0;
                for (int q = 0; q < 4; ++q)
                  if (ST_SB[i][q])
                    s += ST_SB[i][q] * pb[((q >> 1) * Kh + 4 * kq + u) * N + (q & 1) * Nh + p * NPW + c];
                v[u] = int16_t(s);
              }
              // widen_block_wino's layout: [half][kq][group][X = (b1, b3) x 8 columns | Y = (b0, b2) x 8 columns]
              int16_t* d = blk + (c / 32) * n * 128 + (kq - k0) * 128 + ((c % 32) / 8) * 32 + 2 * (c % 8);
              d[0] = v[1];
              d[1] = v[3];
              d[16] = v[0];
              d[17] = v[2];
              cc[c] += uint32_t(int32_t(v[0]) * v[1] + int32_t(v[2]) * v[3]);
            }
        }
        for (int c = 0; c < NPW; ++c) pt[(i * NPh + p) * NPW + c] = i32(cc[c]);
      }
  }
  return py::make_tuple(wide, terms);
}

struct StrassenScratch;  // kept_i16's tag: strassen_run's per-thread scratch

// C = (A - zero_point) @ B through the seven products; A int8 or uint8 codes (T), rows of C written by the items
template <typename T>
void strassen_run(const T* A, ssize_t M, ssize_t K, i32 zp, const int16_t* wide, const i32* terms, ssize_t N,
                  i32* C) {
  const ssize_t Mh = M / 2, Kh = K / 2, Nh = N / 2, K4h = Kh / 4, NPh = Nh / NPW, per = st_product_elems(K, N);
  const ssize_t lda = wino_lda(K4h);
  const int T_ = tl::n_threads();
  const ssize_t MB = (Mh + WINO_MR - 1) / WINO_MR;  // row blocks of the half
  const ssize_t maxb = ST_ITEM_BLOCKS;
  const ssize_t nitems = ssize_t(T_) * std::max<ssize_t>(1, (MB + T_ * maxb - 1) / (T_ * maxb));
  std::atomic<bool> no_memory{false};
#pragma omp parallel num_threads(T_)
  {
    // per thread, 64-byte aligned, kept between calls up to 4 MB (a fresh mmap'd buffer per call pays page faults):
    // the seven A operands of an item (7 x ST_ITEM_ROWS rows), the product tile (int32) and one operand row's sum
    const size_t n_ops = size_t(ST_PRODUCTS) * ST_ITEM_ROWS * lda, n_i32 = size_t(ST_ITEM_ROWS) * NPW;
    const size_t need = n_ops + 2 * n_i32 + size_t(Kh) + 32;
    AlignedI16 own(nullptr, std::free);
    int16_t* buf = nullptr;
    try {  // no exception may leave the parallel region: a failed allocation is reported after it
      buf = kept_i16<StrassenScratch>(need, size_t(2) << 20, own);
    } catch (const std::bad_alloc&) {
      no_memory = true;
    }
    int16_t* const ops = buf;
    // ST_ITEM_ROWS (24) x lda (a multiple of 16) int16 is a multiple of 64 bytes: the int32 parts stay aligned
    i32* const tile = buf ? reinterpret_cast<i32*>(buf + n_ops) : nullptr;
    int16_t* const sum = buf ? reinterpret_cast<int16_t*>(tile + ST_ITEM_ROWS * NPW) : nullptr;
#pragma omp for schedule(dynamic, 1) nowait
    for (ssize_t it = 0; it < nitems; ++it) {
      const ssize_t r0 = std::min(Mh, MB * it / nitems * WINO_MR), r1 = std::min(Mh, MB * (it + 1) / nitems * WINO_MR);
      const ssize_t rows = r1 - r0;
      if (rows <= 0 || no_memory) continue;
      // the seven A operands of these rows: sum_q sa[i][q] (A_q - zero point), as Winograd int16 rows
      for (int i = 0; i < ST_PRODUCTS; ++i)
        for (ssize_t r = r0; r < r1; ++r) {
          const T* a[2] = {nullptr, nullptr};  // the one or two quadrant rows of this operand, and their signs
          int sg[2] = {0, 0}, n = 0;
          for (int q = 0; q < 4; ++q)
            if (ST_SA[i][q]) {
              a[n] = A + ((q >> 1) * Mh + r) * K + (q & 1) * Kh;
              sg[n++] = ST_SA[i][q];
            }
          if (n == 1) {
            for (ssize_t k = 0; k < Kh; ++k) sum[k] = int16_t(sg[0] * (int(a[0][k]) - zp));
          } else {  // zero points cancel in a difference and double in a sum
            const int z2 = (sg[0] + sg[1]) * zp;
            for (ssize_t k = 0; k < Kh; ++k) sum[k] = int16_t(sg[0] * int(a[0][k]) + sg[1] * int(a[1][k]) - z2);
          }
          wino_row(sum, Kh, ops + (i * ST_ITEM_ROWS + (r - r0)) * lda, lda);
        }
      for (ssize_t p = 0; p < NPh; ++p) {
        bool written[4] = {false, false, false, false};  // C's four blocks of this panel: set by their first product
        for (int i = 0; i < ST_PRODUCTS; ++i) {
          const int16_t* Ai = ops + i * ST_ITEM_ROWS * lda;
          const int16_t* Bi = wide + i * per + p * K4h * 256;
          const i32* cc = terms + (i * NPh + p) * NPW;
          for (ssize_t r = 0; r < rows; ++r) {  // the tile starts at -(row term + column term), as in gemm_rows
            const uint32_t rt = uint32_t(wino_row_term(Ai + r * lda, K4h));
            for (int c = 0; c < NPW; ++c) tile[r * NPW + c] = i32(0u - rt - uint32_t(cc[c]));
          }
          for (ssize_t k0 = 0; k0 < K4h; k0 += ST_KCB) {
            const ssize_t k1 = std::min(K4h, k0 + ST_KCB);
            const int16_t* bwk = Bi + k0 * 256;
            for (int h = 0; h < NPW / 32; ++h)
              for (ssize_t r = 0; r < rows; r += WINO_MR) {
                const int16_t* ar = Ai + r * lda;
                i32* tr = tile + r * NPW;
                switch (std::min<ssize_t>(WINO_MR, rows - r)) {
                  case 1: mk_wino<1>(ar, lda, bwk, k0, k1, tr, h, h + 1); break;
                  case 2: mk_wino<2>(ar, lda, bwk, k0, k1, tr, h, h + 1); break;
                  default: mk_wino<3>(ar, lda, bwk, k0, k1, tr, h, h + 1); break;
                }
              }
          }
          for (int q = 0; q < 4; ++q) {  // C_q (+)= sc[i][q] * M_i (mod 2^32), straight into the rows of C
            const int s = ST_SC[i][q];
            if (!s) continue;
            const bool first = !written[q];
            written[q] = true;
            for (ssize_t r = 0; r < rows; ++r) {
              uint32_t* c = reinterpret_cast<uint32_t*>(C + ((q >> 1) * Mh + r0 + r) * N + (q & 1) * Nh + p * NPW);
              const uint32_t* t = reinterpret_cast<const uint32_t*>(tile + r * NPW);
              if (first)
                for (int e = 0; e < NPW; ++e) c[e] = s > 0 ? t[e] : 0u - t[e];
              else if (s > 0)
                for (int e = 0; e < NPW; ++e) c[e] += t[e];
              else
                for (int e = 0; e < NPW; ++e) c[e] -= t[e];
            }
          }
        }
      }
    }
  }
  if (no_memory) throw std::bad_alloc();
}

// C = (A - zero_point) @ B with B prepared by int8_strassen_pack; exact int32
py::array_t<i32> gemm_strassen(const py::array& a_in, const py::array& wide_in, const py::array& terms_in, ssize_t K,
                               ssize_t N, int zero_point) {
  const bool u8 = a_in.dtype().is(py::dtype::of<uint8_t>());
  if (!u8 && !a_in.dtype().is(py::dtype::of<i8>()))
    throw py::type_error("int8_gemm_strassen: a must have dtype int8 or uint8, got " +
                         std::string(py::str(a_in.dtype())));
  if (!has("avx2"))
    tl::value_error("int8_gemm_strassen: needs AVX2 (the Winograd kernel), which this CPU (or level) lacks");
  if (a_in.ndim() != 2) tl::value_error("int8_gemm_strassen: a must be 2-D, got ndim " + std::to_string(a_in.ndim()));
  if (!u8 && zero_point != 0) tl::value_error("int8_gemm_strassen: zero_point applies to uint8 a only");
  if (u8 && (zero_point < 0 || zero_point > 255))
    tl::value_error("int8_gemm_strassen: zero_point " + std::to_string(zero_point) + " outside [0, 255]");
  const ssize_t M = a_in.shape(0);
  if (a_in.shape(1) != K)
    tl::value_error("int8_gemm_strassen: a has K=" + std::to_string(a_in.shape(1)) + ", the prepared B K=" +
                    std::to_string(K));
  const std::string why = strassen_shape_error(M, K, N);
  if (!why.empty()) tl::value_error("int8_gemm_strassen: shape (M, K, N) = (" + std::to_string(M) + ", " +
                                    std::to_string(K) + ", " + std::to_string(N) + "):" + why);
  // as int8_gemm_packed: |C| <= K * 128 * 128 (int8 A) or K * 255 * 128 (uint8 A minus its zero point) fits int32
  const ssize_t kmax = u8 ? 65536 : (ssize_t(1) << 17) - 1;
  if (K > kmax)
    tl::value_error("int8_gemm_strassen: K=" + std::to_string(K) + " > " + std::to_string(kmax) +
                    " could overflow the int32 result");
  auto wide = py::array_t<int16_t, py::array::c_style>::ensure(wide_in);
  auto terms = py::array_t<i32, py::array::c_style>::ensure(terms_in);
  if (!wide || !terms || wide.size() != ST_PRODUCTS * st_product_elems(K, N) ||
      terms.size() != ST_PRODUCTS * (N / 2 / NPW) * NPW)
    tl::value_error("int8_gemm_strassen: the prepared B does not match K=" + std::to_string(K) + ", N=" +
                    std::to_string(N) + " (make it with int8_strassen_pack)");
  py::array_t<i32> c({M, N});
  i32* pc = c.mutable_data();
  const int16_t* pw = wide.data();
  AlignedI16 realigned(nullptr, std::free);
  if (reinterpret_cast<uintptr_t>(pw) % 64) {  // a copy of int8_strassen_pack's (aligned) buffer: align it again
    realigned.reset(aligned_i16(size_t(wide.size())));
    std::memcpy(realigned.get(), pw, size_t(wide.size()) * sizeof(int16_t));
    pw = realigned.get();
  }
  if (u8) {
    auto a = py::array_t<uint8_t, py::array::c_style>::ensure(a_in);
    py::gil_scoped_release release;
    strassen_run(a.data(), M, K, i32(zero_point), pw, terms.data(), N, pc);
  } else {
    auto a = as_int8(a_in, "a");
    py::gil_scoped_release release;
    strassen_run(a.data(), M, K, 0, pw, terms.data(), N, pc);
  }
  return c;
}

}  // namespace

TL_REGISTER(quant) {
  m.def("int8_strassen_pack", &strassen_pack, py::arg("b"),
        "Strassen's seven B operands of int8 B [K, N] (K % 8 == 0, N % 128 == 0), widened for the Winograd kernel: "
        "(int16 operands, int32 column terms)");
  m.def("int8_gemm_strassen", &gemm_strassen, py::arg("a"), py::arg("wide"), py::arg("terms"), py::arg("k"),
        py::arg("n"), py::arg("zero_point") = 0,
        "C = (A - zero_point) @ B by one level of Strassen (7 block products) on the avx2_wino kernel; exact int32");
  m.def("int8_strassen_signs", []() {
    py::list a, b, c;
    for (int i = 0; i < ST_PRODUCTS; ++i) {
      py::list ra, rb, rc;
      for (int q = 0; q < 4; ++q) {
        ra.append(int(ST_SA[i][q]));
        rb.append(int(ST_SB[i][q]));
        rc.append(int(ST_SC[i][q]));
      }
      a.append(ra);
      b.append(rb);
      c.append(rc);
    }
    return py::make_tuple(a, b, c);
  }, "the (A operand, B operand, C update) signs per product and quadrant (11, 12, 21, 22)");
}
