// conv_implicit.cpp — v2 of the cpp conv2d for tinylearn.conv: the implicit-GEMM forward (conv2d_forward) and dW
// (conv2d_backward_weight), with its own 8x32 / 8x16 AVX-512 micro-kernel; micro_kernel_isa. Window geometry:
// conv_window.h (shared with conv_im2col.cpp).
// Why one file (> 500 lines): the forward and dW share the B packing straight from the image (pack_b_implicit and
// its AVX-512 masked-segment form), the panel tiling and the micro-kernel choice; split, all of it would become a
// header of internals.
//
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
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common.h"
#include "conv_direct.h"
#include "conv_window.h"
#include "gemm_ukr.h"
#include "simd_transpose.h"
#include "simd_ukr.h"

namespace py = pybind11;

namespace {

using namespace tl::conv_window;

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
}
