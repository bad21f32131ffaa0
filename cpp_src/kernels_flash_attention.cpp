// kernels_flash_attention.cpp — fused CPU flash attention behind tinylearn.kernels(backend="cpp"). Works on
// C-contiguous float32 or float64 arrays that the Python dispatcher (tinylearn/kernels/cpu.py) has already reshaped
// to [batch*heads, seq, dim]. Part of _C.kernels (several files register into it, see registry.h).
// Why one file (> 500 lines): forward and backward of every rung share the argument checks, the version dispatch
// and the tiled rung's scratch layout; the SIMD rungs' kernels already live in flash_attention_simd.inc.
//
// Versions ladder (llm.c dev/cuda style; every rung is checked against torch SDPA in tests/test_flash_cpu.py and
// benchmarked by `tinylearn bench kernels` / notebook 05):
//   tiled              v0: tiled online softmax (Dao et al. 2022): per (head, query block) keep running max m,
//                      sum l and unnormalised O; O(block^2) scratch, never the N x N matrix. S = Q K^T and
//                      acc += P V are 4 x 32 micro-GEMMs (small_gemm) that the compiler vectorises
//                      (`#pragma omp simd`), exp is the branch-free exp_approx; OpenMP over (head, query block).
//                      float64 runs this code under every version name (it exists for gradcheck).
//   blocked_simd       v1: flash_attention_simd.inc, one thread. Explicit SIMD (AVX-512 / AVX2 / scalar picked
//                      at run time through vec_math.h, TINYLEARN_CPU_FEATURES forces it): Q block packed
//                      transposed and pre-scaled once, scores kept transposed (a row per key) so that the online
//                      softmax statistics of W queries are one vector and need no horizontal reduction,
//                      register-tiled 6 x (4 x 16) micro-kernels for S = K Q^T and acc += P V reading K and V in
//                      place, the vector exp of vec_math.h, causal key tiles past the block's last query skipped.
//   blocked_simd_omp   v2 (default): blocked_simd + OpenMP over (head, query block) work items, dynamic schedule,
//                      head-major (a thread's next item mostly reuses the same head's K, V from its L2), within a
//                      head the heaviest (causal: last) query blocks first so the team ends on short items.
//                      [1,8,512,64] gives 64 items of 64 queries: no unbalanced last wave on 2 threads.
// Extra memory: per thread QT (D x Br) + S (64 x Br) + acc (Br x Dv) floats, plus lse (N per head): O(N).
//
// Backward (flash_attention_backward, same version names):
//   tiled              recompute P = exp(S - lse) tile by tile: pass A over (head, key block) -> dK, dV; pass B over
//                      (head, query block) -> dQ (no atomics, S recomputed twice). float64 runs it under every name.
//   blocked_simd(_omp) FlashAttention-2 backward (flash_attention_simd.inc: pack_head, bwd_item): every head packed
//                      once (QT, dO^T, lse, rowsum(dO O)), then OpenMP over (key block, head) items that own their
//                      dK/dV rows; dQ accumulates in one buffer per thread, summed and scaled at the end. Five
//                      register-tiled GEMMs per tile (S, dP, dV, dK, dQ) instead of the tiled rung's seven.
#include "kernels_math.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;

// ---- flash attention -----------------------------------------------------------------------------------------
struct AttnDims {
  ssize_t BH, Nq, Nk, D, Dv;
};

template <typename T>
AttnDims check_attn(const carr<T>& q, const carr<T>& k, const carr<T>& v, const char* fn) {
  need_ndim(q, 3, fn, "q");
  need_ndim(k, 3, fn, "k");
  need_ndim(v, 3, fn, "v");
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(2) != q.shape(2) || v.shape(1) != k.shape(1))
    tl::value_error(std::string(fn) + ": incompatible shapes q " + shape_str(q) + ", k " + shape_str(k) + ", v " +
                    shape_str(v) + " (need q [BH,Nq,D], k [BH,Nk,D], v [BH,Nk,Dv])");
  if (k.shape(1) < 1) tl::value_error(std::string(fn) + ": k must have at least one key, got shape " + shape_str(k));
  return {q.shape(0), q.shape(1), k.shape(1), q.shape(2), v.shape(2)};
}

// Register-blocked micro-kernels: a 4-row x 32-column block of the output lives in local arrays the compiler keeps
// in vector registers across the whole k loop (each loaded vector of the streamed operand feeds 4 FMAs).
constexpr int kMR = 4, kNR = 32;

// C[i][c] (+)= sum_k A[i][k] * B[k][c] for i < M, c < N, k < Kd; row strides lda, ldb, ldc. accumulate=false
// overwrites C. Tails (M % 4, N % 32) take the plain loops.
template <typename T>
void small_gemm(const T* A, ssize_t lda, const T* B, ssize_t ldb, T* C, ssize_t ldc, ssize_t M, ssize_t N, ssize_t Kd,
                bool accumulate) {
  ssize_t i = 0;
  for (; i + kMR <= M; i += kMR) {
    ssize_t c0 = 0;
    for (; c0 + kNR <= N; c0 += kNR) {
      T acc[kMR][kNR];
      for (int r = 0; r < kMR; ++r)
        for (int w = 0; w < kNR; ++w) acc[r][w] = accumulate ? C[(i + r) * ldc + c0 + w] : T(0);
      for (ssize_t k = 0; k < Kd; ++k) {
        const T* b = B + k * ldb + c0;
        const T a0 = A[i * lda + k], a1 = A[(i + 1) * lda + k], a2 = A[(i + 2) * lda + k], a3 = A[(i + 3) * lda + k];
#pragma omp simd
        for (int w = 0; w < kNR; ++w) {
          acc[0][w] += a0 * b[w];
          acc[1][w] += a1 * b[w];
          acc[2][w] += a2 * b[w];
          acc[3][w] += a3 * b[w];
        }
      }
      for (int r = 0; r < kMR; ++r)
        for (int w = 0; w < kNR; ++w) C[(i + r) * ldc + c0 + w] = acc[r][w];
    }
    for (ssize_t r = i; r < i + kMR; ++r)
      for (ssize_t c = c0; c < N; ++c) {
        T sum = accumulate ? C[r * ldc + c] : T(0);
        for (ssize_t k = 0; k < Kd; ++k) sum += A[r * lda + k] * B[k * ldb + c];
        C[r * ldc + c] = sum;
      }
  }
  for (; i < M; ++i) {
    T* ci = C + i * ldc;
    if (!accumulate)
      for (ssize_t c = 0; c < N; ++c) ci[c] = 0;
    for (ssize_t k = 0; k < Kd; ++k) {
      const T a = A[i * lda + k];
      const T* b = B + k * ldb;
#pragma omp simd
      for (ssize_t c = 0; c < N; ++c) ci[c] += a * b[c];
    }
  }
}

// S[i][j] = scale * q_i . k_j for a Br x Bc tile; masked entries (causal: j > i) get -inf.
// The K tile is first transposed into kt [D][Bc] so that S = Q_tile kt is a small GEMM with unit-stride rows.
template <typename T>
void score_tile(const T* q, const T* k, T* S, T* kt, ssize_t i0, ssize_t br, ssize_t j0, ssize_t bc, ssize_t D, T scale,
                bool causal, ssize_t Bc) {
  for (ssize_t j = 0; j < bc; ++j)
    for (ssize_t d = 0; d < D; ++d) kt[d * Bc + j] = k[(j0 + j) * D + d];
  small_gemm(q + i0 * D, D, kt, Bc, S, Bc, br, bc, D, false);
  for (ssize_t i = 0; i < br; ++i) {
    T* si = S + i * Bc;
    const ssize_t lim = causal ? i0 + i - j0 : bc;  // keys j0 + j with j > lim are masked
#pragma omp simd
    for (ssize_t j = 0; j < bc; ++j) si[j] = j > lim ? neg_inf<T>() : si[j] * scale;
  }
}

template <typename T>
py::tuple flash_attention_forward(carr<T> q, carr<T> k, carr<T> v, bool causal, ssize_t block) {
  const AttnDims a = check_attn(q, k, v, "flash_attention_forward");
  if (block < 1) tl::value_error("flash_attention_forward: block_size must be >= 1, got " + std::to_string(block));
  const ssize_t BH = a.BH, Nq = a.Nq, Nk = a.Nk, D = a.D, Dv = a.Dv;
  carr<T> o({BH, Nq, Dv});
  carr<T> lse({BH, Nq});
  const T *pq = q.data(), *pk = k.data(), *pv = v.data();
  T *po = o.mutable_data(), *pl = lse.mutable_data();
  const T scale = T(1) / std::sqrt(T(D));
  block = std::min(block, std::max<ssize_t>(std::max(Nq, Nk), 1));  // a tile never exceeds the sequence
  const ssize_t nqb = (Nq + block - 1) / block;
  // per-thread scratch allocated here, outside the parallel region: an exception (bad_alloc) must never escape
  // an OpenMP region (that is std::terminate -> SIGABRT)
  const int nth = tl::n_threads();
  std::vector<std::vector<T>> S_(nth, std::vector<T>(block * block)), m_(nth, std::vector<T>(block)),
      l_(nth, std::vector<T>(block)), acc_(nth, std::vector<T>(block * Dv)), kt_(nth, std::vector<T>(block * D));
  {
    py::gil_scoped_release release;
#pragma omp parallel num_threads(nth)
    {
      const int tid = tl::thread_id();
      std::vector<T>&S = S_[tid], &m = m_[tid], &l = l_[tid], &acc = acc_[tid], &kt = kt_[tid];
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (ssize_t bh = 0; bh < BH; ++bh) {
        for (ssize_t qb = 0; qb < nqb; ++qb) {
          const T* qh = pq + bh * Nq * D;
          const T* kh = pk + bh * Nk * D;
          const T* vh = pv + bh * Nk * Dv;
          const ssize_t i0 = qb * block, br = std::min(block, Nq - i0);
          std::fill(m.begin(), m.end(), neg_inf<T>());
          std::fill(l.begin(), l.end(), T(0));
          std::fill(acc.begin(), acc.end(), T(0));
          for (ssize_t j0 = 0; j0 < Nk; j0 += block) {
            if (causal && j0 > i0 + br - 1) break;  // every later key is masked for this whole query block
            const ssize_t bc = std::min(block, Nk - j0);
            score_tile(qh, kh, S.data(), kt.data(), i0, br, j0, bc, D, scale, causal, block);
            for (ssize_t i = 0; i < br; ++i) {
              T* Si = S.data() + i * block;
              T mx = m[i];
#pragma omp simd reduction(max : mx)
              for (ssize_t j = 0; j < bc; ++j) mx = Si[j] > mx ? Si[j] : mx;
              if (mx == neg_inf<T>()) {  // the whole tile row is masked: P = 0, state unchanged
                for (ssize_t j = 0; j < bc; ++j) Si[j] = 0;
                continue;
              }
              const T alpha = m[i] == neg_inf<T>() ? T(0) : exp_approx(m[i] - mx);
              T s = 0;
#pragma omp simd reduction(+ : s)
              for (ssize_t j = 0; j < bc; ++j) {
                const T p = exp_approx(Si[j] - mx);  // exp(-inf) = 0 for masked keys
                Si[j] = p;
                s += p;
              }
              l[i] = l[i] * alpha + s;
              m[i] = mx;
              T* ai = acc.data() + i * Dv;
#pragma omp simd
              for (ssize_t d = 0; d < Dv; ++d) ai[d] *= alpha;
            }
            // acc += P V_tile: one register-blocked GEMM for the whole tile
            small_gemm(S.data(), block, vh + j0 * Dv, Dv, acc.data(), Dv, br, Dv, bc, true);
          }
          for (ssize_t i = 0; i < br; ++i) {
            T* oi = po + (bh * Nq + i0 + i) * Dv;
            const T inv = l[i] > 0 ? T(1) / l[i] : nan_v<T>();  // l == 0 only for a fully masked row
            for (ssize_t d = 0; d < Dv; ++d) oi[d] = acc[i * Dv + d] * inv;
            pl[bh * Nq + i0 + i] = l[i] > 0 ? m[i] + std::log(l[i]) : neg_inf<T>();
          }
        }
      }
    }
  }
  return py::make_tuple(o, lse);
}


// ---- blocked SIMD rungs (float32): one body, three instruction sets ------------------------------------------
struct FaCtx {
  const float *q, *k, *v;
  float *o, *lse;
  ssize_t Nq, Nk, D, Dv, Br, Brp, Bc;
  bool causal;
  float scale;
};
struct FbCtx {  // the backward (flash_attention_simd.inc: bwd_item, pack_head)
  const float *q, *k, *v, *o, *lse, *dout;
  float *qt, *dot, *L, *Dr;  // packed per head: [BH][D][Nqp], [BH][Dv][Nqp], [BH][Nqp], [BH][Nqp]
  float *dk, *dv;
  ssize_t Nq, Nk, D, Dv, Nqp, Br, Brp, Bc;
  bool causal;
  float scale;
};

namespace fa_scalar {
using vf = float;
constexpr ssize_t W = 1;
constexpr int NVMAX = 2;
inline vf load(const float* p) { return *p; }
inline void store(float* p, vf x) { *p = x; }
inline vf splat(float x) { return x; }
inline vf fmadd(vf a, vf b, vf c) { return a * b + c; }
inline vf vmax(vf a, vf b) { return vm::scalar::max_ps(a, b); }
inline vf vexp(vf x) { return vm::scalar::exp(x); }
inline vf finite_or_zero(vf x) { return x == -std::numeric_limits<float>::infinity() ? 0.0f : x; }
#include "flash_attention_simd.inc"
}  // namespace fa_scalar

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace fa_avx2 {
using vf = __m256;
constexpr ssize_t W = 8;
constexpr int NVMAX = 2;
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf x) { _mm256_storeu_ps(p, x); }
inline vf splat(float x) { return _mm256_set1_ps(x); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vexp(vf x) { return vm::avx2::exp(x); }
inline vf finite_or_zero(vf x) {
  const vf ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  return _mm256_blendv_ps(x, _mm256_setzero_ps(), _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ));
}
#include "flash_attention_simd.inc"
}  // namespace fa_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace fa_avx512 {
using vf = __m512;
constexpr ssize_t W = 16;
constexpr int NVMAX = 4;
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vf x) { _mm512_storeu_ps(p, x); }
inline vf splat(float x) { return _mm512_set1_ps(x); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vexp(vf x) { return vm::avx512::exp(x); }
inline vf finite_or_zero(vf x) {
  const vf ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ), x, _mm512_setzero_ps());
}
#include "flash_attention_simd.inc"
}  // namespace fa_avx512
#pragma GCC pop_options

using FaBlockFn = void (*)(const FaCtx&, ssize_t, ssize_t, float*);
struct FaPath {
  FaBlockFn fn;
  ssize_t W;
  const char* name;
};

// The widest path after TINYLEARN_CPU_FEATURES whose vector width divides Dv (the output rows are whole vectors).
FaPath flash_path(ssize_t Dv) {
  const vm::Isa isa = vm::best_isa();
  if (isa == vm::Isa::avx512 && Dv % 16 == 0) return {fa_avx512::block, 16, "avx512"};
  if (isa != vm::Isa::scalar && vm::isa_available(vm::Isa::avx2) && Dv % 8 == 0) return {fa_avx2::block, 8, "avx2"};
  return {fa_scalar::block, 1, "scalar"};
}

constexpr ssize_t kFlashBc = 64;  // keys per tile of the blocked rungs (64 x Br scores stay in L1)

py::tuple flash_forward_blocked(const carr<float>& q, const carr<float>& k, const carr<float>& v, bool causal,
                                ssize_t block, bool threaded) {
  const AttnDims a = check_attn(q, k, v, "flash_attention_forward");
  const ssize_t BH = a.BH, Nq = a.Nq, Nk = a.Nk, D = a.D, Dv = a.Dv;
  carr<float> o({BH, Nq, Dv});
  carr<float> lse({BH, Nq});
  const FaPath path = flash_path(Dv);
  block = std::min(block, std::max<ssize_t>(Nq, 1));
  const ssize_t Brp = (block + path.W - 1) / path.W * path.W;
  const FaCtx c{q.data(), k.data(), v.data(), o.mutable_data(), lse.mutable_data(), Nq, Nk, D, Dv, block, Brp,
                kFlashBc, causal, 1.0f / std::sqrt(static_cast<float>(D))};
  const ssize_t nqb = (Nq + block - 1) / block, items = BH * nqb;
  // threads: at most one per work item, and one for a small problem (waking the team costs more than it saves)
  int nth = threaded ? tl::n_threads() : 1;
  if (static_cast<double>(BH) * Nq * Nk * (D + Dv) < 1 << 20) nth = 1;
  nth = static_cast<int>(std::max<ssize_t>(1, std::min<ssize_t>(nth, items)));
  const ssize_t per = D * Brp + kFlashBc * Brp + block * Dv + 3 * Brp;
  std::vector<float> scratch(static_cast<size_t>(per) * nth);  // allocated outside the parallel region
  {
    py::gil_scoped_release release;
    float* base = scratch.data();
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1) if (nth > 1)
    for (ssize_t t = 0; t < items; ++t) {
      // head-major (a thread's consecutive items reuse the head's K, V from its L2), within a head the last query
      // blocks first (the longest under causal), so the team ends on the shortest items
      const ssize_t bh = t / nqb, qb = nqb - 1 - t % nqb;
      path.fn(c, bh, qb, base + per * tl::thread_id());
    }
  }
  return py::make_tuple(o, lse);
}

template <typename T>
py::tuple flash_attention_dispatch(carr<T> q, carr<T> k, carr<T> v, bool causal, ssize_t block,
                                   const std::string& version) {
  if (version != "tiled" && version != "blocked_simd" && version != "blocked_simd_omp")
    tl::value_error("flash_attention_forward: version must be 'tiled', 'blocked_simd' or 'blocked_simd_omp', got '" +
                    version + "'");
  if (block < 1) tl::value_error("flash_attention_forward: block_size must be >= 1, got " + std::to_string(block));
  if constexpr (std::is_same_v<T, float>) {
    if (version != "tiled") return flash_forward_blocked(q, k, v, causal, block, version == "blocked_simd_omp");
  }
  return flash_attention_forward(q, k, v, causal, block);
}

using FbItemFn = void (*)(const FbCtx&, ssize_t, ssize_t, float*, float*);
using FbPackFn = void (*)(const FbCtx&, ssize_t);
struct FbPath {
  FbItemFn item;
  FbPackFn pack;
  ssize_t W;
  const char* name;
};

// The backward's path: the widest vector width that divides both D and Dv (dK/dQ rows and dV rows are whole vectors).
FbPath flash_bwd_path(ssize_t D, ssize_t Dv) {
  const vm::Isa isa = vm::best_isa();
  if (isa == vm::Isa::avx512 && D % 16 == 0 && Dv % 16 == 0) return {fa_avx512::bwd_item, fa_avx512::pack_head, 16, "avx512"};
  if (isa != vm::Isa::scalar && vm::isa_available(vm::Isa::avx2) && D % 8 == 0 && Dv % 8 == 0)
    return {fa_avx2::bwd_item, fa_avx2::pack_head, 8, "avx2"};
  return {fa_scalar::bwd_item, fa_scalar::pack_head, 1, "scalar"};
}

// Blocked SIMD backward (float32): pack every head once (QT, dO^T, L, rowsum(dO O): as big as q and dout, O(N)),
// then OpenMP over (key block, head) items, each owning its dK/dV rows; dQ goes to one buffer per thread
// (thread 0 writes the output itself), summed and scaled at the end. Extra memory O(N): packed q, dout plus
// (threads - 1) dQ buffers plus 2 Bc x Br tiles per thread.
py::tuple flash_backward_blocked(const carr<float>& q, const carr<float>& k, const carr<float>& v, const carr<float>& o,
                                 const carr<float>& lse, const carr<float>& dout, const AttnDims& a, bool causal,
                                 ssize_t block, bool threaded) {
  const ssize_t BH = a.BH, Nq = a.Nq, Nk = a.Nk, D = a.D, Dv = a.Dv;
  carr<float> dq({BH, Nq, D}), dk({BH, Nk, D}), dv({BH, Nk, Dv});
  const FbPath path = flash_bwd_path(D, Dv);
  const ssize_t W = path.W;
  const ssize_t Nqp = (Nq + W - 1) / W * W;
  const ssize_t Br = (std::min(block, Nqp) + W - 1) / W * W;  // query rows per tile: a whole number of vectors
  std::vector<float> packed(static_cast<size_t>(BH * Nqp * (D + Dv + 2)));
  float* pk = packed.data();
  const FbCtx c{q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), pk, pk + BH * D * Nqp,
                pk + BH * (D + Dv) * Nqp, pk + BH * (D + Dv + 1) * Nqp, dk.mutable_data(), dv.mutable_data(), Nq, Nk,
                D, Dv, Nqp, Br, Br, kFlashBc, causal, 1.0f / std::sqrt(static_cast<float>(D))};
  const ssize_t nkb = (Nk + kFlashBc - 1) / kFlashBc, items = BH * nkb;
  int nth = threaded ? tl::n_threads() : 1;
  if (static_cast<double>(BH) * Nq * Nk * (D + Dv) < 1 << 19) nth = 1;
  nth = static_cast<int>(std::max<ssize_t>(1, std::min<ssize_t>(nth, items)));
  const ssize_t per = 2 * kFlashBc * Br;
  std::vector<float> scratch(static_cast<size_t>(per) * nth);
  std::vector<float> dq_extra(static_cast<size_t>(BH * Nq * D) * (nth - 1));  // all allocated outside the region
  {
    py::gil_scoped_release release;
    float* pdq = dq.mutable_data();
    const ssize_t nq_all = BH * Nq * D;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
      const int tid = tl::thread_id();
      float* mydq = tid == 0 ? pdq : dq_extra.data() + (tid - 1) * nq_all;
      std::fill(mydq, mydq + nq_all, 0.0f);
#pragma omp for schedule(static)
      for (ssize_t bh = 0; bh < BH; ++bh) path.pack(c, bh);
      // items key-block major: kb = 0 first (under causal the heaviest: the first keys are seen by every query)
#pragma omp for schedule(dynamic, 1)
      for (ssize_t t = 0; t < items; ++t) path.item(c, t % BH, t / BH, scratch.data() + per * tid, mydq);
      // dq = scale (dq_0 + dq_1 + ...), split over the team (the for's barrier above: every buffer is complete)
      const float s = c.scale;
#pragma omp for schedule(static)
      for (ssize_t r = 0; r < BH * Nq; ++r) {
        float* out = pdq + r * D;
        for (int u = 0; u + 1 < nth; ++u) {
          const float* src = dq_extra.data() + u * nq_all + r * D;
          for (ssize_t d = 0; d < D; ++d) out[d] += src[d];
        }
        for (ssize_t d = 0; d < D; ++d) out[d] *= s;
      }
    }
  }
  return py::make_tuple(dq, dk, dv);
}

template <typename T>
py::tuple flash_attention_backward(carr<T> q, carr<T> k, carr<T> v, carr<T> o, carr<T> lse, carr<T> dout, bool causal,
                                   ssize_t block, const std::string& version) {
  if (version != "tiled" && version != "blocked_simd" && version != "blocked_simd_omp")
    tl::value_error("flash_attention_backward: version must be 'tiled', 'blocked_simd' or 'blocked_simd_omp', got '" +
                    version + "'");
  const AttnDims a = check_attn(q, k, v, "flash_attention_backward");
  if (block < 1) tl::value_error("flash_attention_backward: block_size must be >= 1, got " + std::to_string(block));
  const ssize_t BH = a.BH, Nq = a.Nq, Nk = a.Nk, D = a.D, Dv = a.Dv;
  need_same(dout, o, "flash_attention_backward", "dout", "o");
  if (o.ndim() != 3 || o.shape(0) != BH || o.shape(1) != Nq || o.shape(2) != Dv)
    tl::value_error("flash_attention_backward: o shape " + shape_str(o) + " does not match q/v");
  if (lse.ndim() != 2 || lse.shape(0) != BH || lse.shape(1) != Nq)
    tl::value_error("flash_attention_backward: lse shape " + shape_str(lse) + " must be (BH, Nq)");
  if constexpr (std::is_same_v<T, float>) {
    if (version != "tiled")
      return flash_backward_blocked(q, k, v, o, lse, dout, a, causal, block, version == "blocked_simd_omp");
  }
  carr<T> dq({BH, Nq, D}), dk({BH, Nk, D}), dv({BH, Nk, Dv});
  const T *pq = q.data(), *pk = k.data(), *pv = v.data(), *po = o.data(), *pl = lse.data(), *pg = dout.data();
  T *pdq = dq.mutable_data(), *pdk = dk.mutable_data(), *pdv = dv.mutable_data();
  const T scale = T(1) / std::sqrt(T(D));
  block = std::min(block, std::max<ssize_t>(std::max(Nq, Nk), 1));  // a tile never exceeds the sequence
  const ssize_t nqb = (Nq + block - 1) / block, nkb = (Nk + block - 1) / block;
  // per-thread scratch allocated outside the parallel regions: no exception may escape an OpenMP region
  const int nth = tl::n_threads();
  std::vector<std::vector<T>> P_(nth, std::vector<T>(block * block)), dS_(nth, std::vector<T>(block * block)),
      kt_(nth, std::vector<T>(block * D));
  {
    py::gil_scoped_release release;
    std::vector<T> Dsum(BH * Nq);  // D_i = dO_i . O_i
#pragma omp parallel for schedule(static)
    for (ssize_t r = 0; r < BH * Nq; ++r) {
      T s = 0;
      for (ssize_t d = 0; d < Dv; ++d) s += pg[r * Dv + d] * po[r * Dv + d];
      Dsum[r] = s;
    }
    // P_ij and dS_ij = P_ij (dO_i . V_j - D_i) for one (query block, key block) tile, into P and dS
    auto tile = [&](ssize_t bh, ssize_t i0, ssize_t br, ssize_t j0, ssize_t bc, T* P, T* dS, T* kt) {
      const T* qh = pq + bh * Nq * D;
      const T* kh = pk + bh * Nk * D;
      const T* vh = pv + bh * Nk * Dv;
      score_tile(qh, kh, P, kt, i0, br, j0, bc, D, scale, causal, block);
      for (ssize_t i = 0; i < br; ++i) {
        const T li = pl[bh * Nq + i0 + i];
        const T Di = Dsum[bh * Nq + i0 + i];
        const T* gi = pg + (bh * Nq + i0 + i) * Dv;
        for (ssize_t j = 0; j < bc; ++j) {
          const T p = li == neg_inf<T>() ? T(0) : exp_approx(P[i * block + j] - li);
          P[i * block + j] = p;
          if (p == T(0)) {
            dS[i * block + j] = 0;
            continue;
          }
          const T* vj = vh + (j0 + j) * Dv;
          T dp = 0;
#pragma omp simd reduction(+ : dp)
          for (ssize_t d = 0; d < Dv; ++d) dp += gi[d] * vj[d];
          dS[i * block + j] = p * (dp - Di);
        }
      }
    };
    // pass A: dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P_ij dO_i   (each key block owned by one thread)
#pragma omp parallel num_threads(nth)
    {
      const int tid = tl::thread_id();
      std::vector<T>&P = P_[tid], &dS = dS_[tid], &kt = kt_[tid];
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (ssize_t bh = 0; bh < BH; ++bh) {
        for (ssize_t kb = 0; kb < nkb; ++kb) {
          const ssize_t j0 = kb * block, bc = std::min(block, Nk - j0);
          T* dkh = pdk + (bh * Nk + j0) * D;
          T* dvh = pdv + (bh * Nk + j0) * Dv;
          std::fill(dkh, dkh + bc * D, T(0));
          std::fill(dvh, dvh + bc * Dv, T(0));
          for (ssize_t i0 = causal ? (j0 / block) * block : 0; i0 < Nq; i0 += block) {
            const ssize_t br = std::min(block, Nq - i0);
            if (causal && j0 > i0 + br - 1) continue;
            tile(bh, i0, br, j0, bc, P.data(), dS.data(), kt.data());
            for (ssize_t i = 0; i < br; ++i) {
              const T* qi = pq + (bh * Nq + i0 + i) * D;
              const T* gi = pg + (bh * Nq + i0 + i) * Dv;
              for (ssize_t j = 0; j < bc; ++j) {
                const T p = P[i * block + j], ds = dS[i * block + j] * scale;
                if (p == T(0)) continue;
                T* dkj = dkh + j * D;
                T* dvj = dvh + j * Dv;
#pragma omp simd
                for (ssize_t d = 0; d < D; ++d) dkj[d] += ds * qi[d];
#pragma omp simd
                for (ssize_t d = 0; d < Dv; ++d) dvj[d] += p * gi[d];
              }
            }
          }
        }
      }
    }
    // pass B: dQ_i = scale sum_j dS_ij k_j   (each query block owned by one thread)
#pragma omp parallel num_threads(nth)
    {
      const int tid = tl::thread_id();
      std::vector<T>&P = P_[tid], &dS = dS_[tid], &kt = kt_[tid];
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (ssize_t bh = 0; bh < BH; ++bh) {
        for (ssize_t qb = 0; qb < nqb; ++qb) {
          const ssize_t i0 = qb * block, br = std::min(block, Nq - i0);
          T* dqh = pdq + (bh * Nq + i0) * D;
          std::fill(dqh, dqh + br * D, T(0));
          for (ssize_t j0 = 0; j0 < Nk; j0 += block) {
            if (causal && j0 > i0 + br - 1) break;
            const ssize_t bc = std::min(block, Nk - j0);
            tile(bh, i0, br, j0, bc, P.data(), dS.data(), kt.data());
            for (ssize_t i = 0; i < br; ++i) {
              T* dqi = dqh + i * D;
              for (ssize_t j = 0; j < bc; ++j) {
                const T ds = dS[i * block + j] * scale;
                if (ds == T(0)) continue;
                const T* kj = pk + (bh * Nk + j0 + j) * D;
#pragma omp simd
                for (ssize_t d = 0; d < D; ++d) dqi[d] += ds * kj[d];
              }
            }
          }
        }
      }
    }
  }
  return py::make_tuple(dq, dk, dv);
}

template <typename T>
void def_flash_attention(py::module_& m) {
  m.def("flash_attention_forward", &flash_attention_dispatch<T>, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("causal") = false, py::arg("block_size") = 64, py::arg("version") = "blocked_simd_omp");
  m.def("flash_attention_backward", &flash_attention_backward<T>, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("o"), py::arg("lse"), py::arg("dout"), py::arg("causal") = false, py::arg("block_size") = 64,
        py::arg("version") = "blocked_simd_omp");
}

}  // namespace

TL_REGISTER(kernels) {
  m.def(
      "flash_attention_path", [](ssize_t dv) { return std::string(flash_path(dv).name); }, py::arg("dv"),
      "the instruction set the blocked_simd rungs take now for value head dim dv ('avx512' | 'avx2' | 'scalar')");
  m.def(
      "flash_attention_backward_path", [](ssize_t d, ssize_t dv) { return std::string(flash_bwd_path(d, dv).name); },
      py::arg("d"), py::arg("dv"),
      "the instruction set the blocked_simd backward takes now for head dims d, dv ('avx512' | 'avx2' | 'scalar')");
  def_flash_attention<float>(m);
  def_flash_attention<double>(m);
}
