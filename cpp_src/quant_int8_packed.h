// quant_int8_packed.h — the packed-B ladder's driver, shared by quant_int8_packed.cpp, quant_int8_dynamic.cpp and
// quant_int8_strassen.cpp: version -> kernel (pick_kern, with avx2_choice's measured AVX2 kernel family), the A
// operand stride, the packed-weight check, the shared int16 copy of B (WideB) and run_row_items, the one OpenMP
// region with no barrier inside that makes A's rows and runs them against every panel (gemm_rows).
// Header-only, in namespace tl::q8.
#pragma once
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include "common.h"
#include "machine_probe.h"
#include "quant_int8_ukr.h"

namespace tl::q8 {

inline bool kern_supported(Kern k) {
  if (k == Kern::vnni) return has("avx512vnni");
  if (k == Kern::avx2_madd16 || k == Kern::avx2_u7 || k == Kern::avx2_wino) return has("avx2");
  return true;
}

inline const char* kern_name(Kern k) {
  switch (k) {
    case Kern::vnni: return "avx512vnni";
    case Kern::avx2_madd16: return "avx2_madd16";
    case Kern::avx2_u7: return "avx2_u7";
    case Kern::avx2_wino: return "avx2_wino";
    default: return "scalar";
  }
}

// AVX2 without VNNI: which kernel family suits this core, measured once per process. madd16 and u7 issue one
// vpmaddwd (or vpmaddubsw) per 16 MACs, Winograd one per 32 MACs plus two vpaddw: the same instruction count,
// so Winograd only wins where the integer multiplier is the bottleneck, i.e. where a stream of vpmaddwd + vpaddd
// runs at < 1.5x the MAC rate of a stream of fp32 FMAs (Zen 2: 1.0x, one multiply pipe next to two FMA pipes;
// cores with two multiply pipes: ~2x). The probe is machine.cpp's mac_rate (~1 ms once per process).
struct Avx2Choice {
  bool wino = false;
  double madd16_over_fma = 0.0;  // the measured MAC-rate ratio (0: not measured, e.g. no FMA)
};
inline const Avx2Choice& avx2_choice() {
  static const Avx2Choice c = [] {
    Avx2Choice r;
    try {
      // a warm-up of each (the core leaves its idle clock; short probes read it low: one process measured 1.45
      // instead of 1.0 with 3 x 4000 trips and no warm-up), then the best of 3 x 20000 trips (~0.1 ms each)
      tl::mac_rate_raw("int8_madd16_ymm", 20000);
      tl::mac_rate_raw("fp32_fma_ymm", 20000);
      double m = 0.0, f = 0.0;
      for (int t = 0; t < 3; ++t) {
        m = std::max(m, tl::mac_rate_raw("int8_madd16_ymm", 20000));
        f = std::max(f, tl::mac_rate_raw("fp32_fma_ymm", 20000));
      }
      r.madd16_over_fma = m / f;
      r.wino = r.madd16_over_fma < 1.5;
    } catch (const std::invalid_argument&) {  // a CPU without FMA (or not x86-64): keep the direct kernels
    }
    return r;
  }();
  return c;
}

// Below this many rows of A, "auto" keeps avx2_u7 for 7-bit codes even where Winograd wins at size: Winograd (like
// madd16) widens B to int16 once per call, u7 reads the packed bytes as they are, and at few rows that per-call
// pass is the larger cost (Zen 2, dynamic Linear 1024->1024: u7 0.37x / 0.87x torch's time at batch 1 / 32,
// Winograd 1.5x / 1.3x; even at 128, Winograd ahead from 512)
constexpr ssize_t WINO_MIN_ROWS = 128;

// version string -> kernel. "auto": vnni, else on AVX2 avx2_wino where the multiplier is the bottleneck
// (avx2_choice) unless M < WINO_MIN_ROWS and the codes are 7-bit, else avx2_u7 when every A code is <= 127 (u7_ok),
// else avx2_madd16; else scalar. An explicit version the CPU (or TINYLEARN_CPU_FEATURES) lacks is a ValueError.
inline Kern pick_kern(const std::string& version, bool u7_ok, ssize_t M, const char* fn) {
  if (version == "auto") {
    if (has("avx512vnni")) return Kern::vnni;
    if (has("avx2")) {
      if (avx2_choice().wino && !(u7_ok && M < WINO_MIN_ROWS)) return Kern::avx2_wino;
      return u7_ok ? Kern::avx2_u7 : Kern::avx2_madd16;
    }
    return Kern::scalar;
  }
  Kern k;
  if (version == "avx512vnni") k = Kern::vnni;
  else if (version == "avx2_madd16") k = Kern::avx2_madd16;
  else if (version == "avx2_u7") k = Kern::avx2_u7;
  else if (version == "avx2_wino") k = Kern::avx2_wino;
  else if (version == "scalar") k = Kern::scalar;
  else
    tl::value_error(std::string(fn) + ": version: unknown '" + version +
                    "' (auto, avx512vnni, avx2_madd16, avx2_u7, avx2_wino, scalar)");
  if (!kern_supported(k))
    tl::value_error(std::string(fn) + ": version: '" + version + "' is not supported by this CPU");
  if (k == Kern::avx2_u7 && !u7_ok)
    tl::value_error(std::string(fn) + ": version: 'avx2_u7' needs activation codes in 0..127 (vpmaddubsw would "
                    "saturate its int16 pair sums); use avx2_madd16, or 7-bit (reduce_range) activations");
  return k;
}

// Row stride (elements) of the A operand: K padded to 4, plus one cache line when the row length in bytes is a
// multiple of 512 (K = 1024, 4096 ...): the 4 rows a micro-kernel reads would otherwise sit a multiple of 4 KB
// apart (or 2 of them would), sharing L1 sets and 4K-aliasing the tile stores -- that halved the rate at K = 4096.
inline ssize_t a_stride(ssize_t K4, int elem_bytes) {
  const ssize_t row = K4 * 4;
  return (row * elem_bytes) % 512 == 0 ? row + 64 / elem_bytes : row;
}

// the Winograd operand's stride: room for the row term (an int32 after the K4 * 4 values), 32-byte multiple
inline ssize_t wino_lda(ssize_t K4) { return a_stride(K4, 2) + 16; }

struct Packed {
  py::array_t<i8, py::array::c_style> P;
  py::array_t<i32, py::array::c_style> cs;
  ssize_t K4, N;
};

inline Packed check_packed(const py::array& P_in, const py::array& cs_in, ssize_t K, ssize_t N, const char* fn) {
  auto P = py::array_t<i8, py::array::c_style>::ensure(P_in);
  auto cs = py::array_t<i32, py::array::c_style>::ensure(cs_in);
  const ssize_t K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  if (!P || !cs || N < 1 || P.size() != NP * K4 * NPW * 4 || cs.size() != NP * NPW)
    tl::value_error(std::string(fn) + ": packed weights do not match K=" + std::to_string(K) +
                    " and n=" + std::to_string(N) + " (pack them with int8_pack)");
  return {P, cs, K4, N};
}

// madd16's int16 copy of the packed B, shared by the threads of one call: each (panel, K block) piece is
// sign-extended once per call by the first thread that needs it (it claims the piece with a CAS, widens it into
// the shared buffer and publishes it), not once per work item -- with 48-row items B was widened 11-12 times per
// call at 512x1024x1024, ~7% of the time. A thread that finds a piece being widened by another does not wait (on a
// loaded 2-core box the other may be descheduled): it widens the piece into its own scratch. No barrier anywhere.
// The buffer is the calling thread's, kept between calls up to 16 MB (a fresh 2 MB allocation per call went back to
// the kernel and came back as page faults: ~20% of the time at 512x1024x1024); larger B get a per-call buffer.
// n int16, 64-byte aligned, for a unique_ptr with std::free (throws std::bad_alloc)
inline int16_t* aligned_i16(size_t n) {
  void* p = std::aligned_alloc(64, (n * sizeof(int16_t) + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<int16_t*>(p);
}
using AlignedI16 = std::unique_ptr<int16_t[], void (*)(void*)>;
// n int16, 64-byte aligned: while n <= keep, the calling thread's buffer for call site Tag, kept between calls and
// grown as needed (a fresh mmap'd block per call pays its page faults every time); above keep, a fresh one in `own`
template <typename Tag>
int16_t* kept_i16(size_t n, size_t keep, AlignedI16& own) {
  thread_local AlignedI16 kept{nullptr, std::free};
  thread_local size_t kept_n = 0;
  if (n > keep) {
    own.reset(aligned_i16(n));
    return own.get();
  }
  if (n > kept_n) {
    kept.reset(aligned_i16(n));
    kept_n = n;
  }
  return kept.get();
}

struct WideB {
  static constexpr size_t kKeep = size_t(8) << 20;  // int16 elements kept per calling thread (16 MB)
  ssize_t K4 = 0, nkb = 0;
  bool wino = false;                              // Winograd layout (widen_block_wino) instead of madd16's
  AlignedI16 own{nullptr, std::free};  // per-call buffer when B exceeds kKeep
  int16_t* buf = nullptr;                         // [panel][kq][NPW x 4], per K block grouped as widen_block writes
  std::unique_ptr<std::atomic<uint8_t>[]> state;  // per (panel, K block): 0 free, 1 being widened, 2 ready
  std::vector<i32> terms;                         // Winograd: per (panel, K block) the NPW column terms
  WideB(ssize_t NP, ssize_t K4_, ssize_t kcb, bool wino_)
      : K4(K4_), nkb((K4_ + kcb - 1) / kcb), wino(wino_), state(new std::atomic<uint8_t>[size_t(NP) * nkb]),
        terms(wino_ ? size_t(NP * nkb * NPW) : 0) {
    const size_t n = size_t(NP) * K4_ * NPW * 4;
    // 64-byte aligned (new[] of a large block returns 16 mod 4096: every other 32-byte load of it split a line)
    buf = kept_i16<WideB>(n, kKeep, own);
    for (ssize_t t = 0; t < NP * nkb; ++t) state[t].store(0, std::memory_order_relaxed);
  }
  // int16 rows [k0, k1) of panel p (bp: its bytes): the shared copy, or the caller's scratch `own`; Winograd:
  // *cc = the block's column terms (shared, or own_cc)
  const int16_t* get(ssize_t p, ssize_t kb, const i8* bp, ssize_t k0, ssize_t k1, int16_t* own, i32* own_cc,
                     const i32** cc) {
    std::atomic<uint8_t>& st = state[p * nkb + kb];
    int16_t* dst = buf + (p * K4 + k0) * NPW * 4;
    i32* tdst = wino ? terms.data() + (p * nkb + kb) * NPW : nullptr;
    uint8_t s = st.load(std::memory_order_acquire);
    if (s == 2) {
      *cc = tdst;
      return dst;
    }
    if (s == 0 && st.compare_exchange_strong(s, 1, std::memory_order_acq_rel)) {
      widen(bp, k0, k1, dst, tdst);
      st.store(2, std::memory_order_release);
      *cc = tdst;
      return dst;
    }
    widen(bp, k0, k1, own, own_cc);
    *cc = own_cc;
    return own;
  }
  void widen(const i8* bp, ssize_t k0, ssize_t k1, int16_t* dst, i32* tdst) const {
    if (wino) {
      widen_block_wino(bp, k0, k1, dst);
      wino_col_terms(dst, k1 - k0, tdst);  // once per call and block, not once per row chunk
    } else {
      widen_block(bp, k0, k1, dst);
    }
  }
};

// K block (4-byte k steps) of the madd16 path: 128 x 64 columns of int16 = 64 KB (L2; the kernel streams one
// 8-column strip, 8 KB, per row block), half the per-block accumulator reductions (hadd) of the 64 used before
constexpr ssize_t KCBW = 128;
// the Winograd kernel's K block: 64 kq of a panel are 32 KB of int16, two contiguous 16 KB halves (one per 32-column
// step of mk_wino); on Zen 2 blocks of 32 and 128 kq were slower
constexpr ssize_t KCB_WINO = 64;
inline ssize_t wide_kcb(Kern k) { return k == Kern::avx2_wino ? KCB_WINO : KCBW; }

// GEMM of rows [r0, r1) of the prepared A against column panels [p0, p1): chunks of at most 48 rows (the chunk's
// int32 tile, 12 KB, stays in L1 next to the 16 KB B block), K blocked by KCB (wide_kcb for madd16 / avx2_wino),
// ep(i, j0, nj, s_row) per row and panel. tile (48 x NPW int32) and bw (madd16: KCBW x NPW x 4 int16) are the calling thread's scratch;
// wb: the shared int16 B of madd16 / avx2_wino (null otherwise).
template <typename AT, typename EP>
void gemm_rows(Kern kern, const AT* A, ssize_t lda, ssize_t r0, ssize_t r1, ssize_t K4, const i8* P, ssize_t N,
               ssize_t p0, ssize_t p1, i32* tile, int16_t* bw, WideB* wb, const EP& ep, ssize_t rot = 0) {
  const int mr = kern_mr(kern);
  const ssize_t maxrows = 48 / mr * mr;
  constexpr bool wide = std::is_same_v<AT, int16_t>;
  const ssize_t kcb = wide ? wide_kcb(kern) : KCB;
  const bool wino = kern == Kern::avx2_wino;
  i32 cc[NPW];      // Winograd: the panel's column terms, summed over the K blocks
  i32 own_cc[NPW];  // ... of a block this thread widened into its own scratch
  for (ssize_t q = 0; q < p1 - p0; ++q) {
    const ssize_t p = p0 + (q + rot) % (p1 - p0);  // panels from p0 + rot on, wrapping
    const i8* bp = P + p * K4 * NPW * 4;
    const ssize_t j0 = p * NPW, nj = std::min<ssize_t>(NPW, N - j0);
    if constexpr (wide) {
      if (wino) {  // the panel's column terms first (widening its blocks now rather than in the K loop below)
        std::memset(cc, 0, sizeof(cc));
        for (ssize_t k0 = 0; k0 < K4; k0 += kcb) {
          const i32* bcc = nullptr;
          wb->get(p, k0 / kcb, bp, k0, std::min(K4, k0 + kcb), bw, own_cc, &bcc);
          for (int c = 0; c < NPW; ++c) cc[c] = i32(uint32_t(cc[c]) + uint32_t(bcc[c]));
        }
      }
    }
    for (ssize_t c0 = r0; c0 < r1; c0 += maxrows) {
      const ssize_t c1 = std::min(r1, c0 + maxrows);
      bool started = false;
      if constexpr (wide) {
        if (wino) {  // S = W - row term - column term (mod 2^32): the tile starts at -(row term + column term)
          for (ssize_t i = c0; i < c1; ++i) {
            const uint32_t rt = uint32_t(wino_row_term(A + i * lda, K4));
            i32* t = tile + (i - c0) * NPW;
            for (int c = 0; c < NPW; ++c) t[c] = i32(0u - rt - uint32_t(cc[c]));
          }
          started = true;
        }
      }
      if (!started) std::memset(tile, 0, size_t(c1 - c0) * NPW * sizeof(i32));
      for (ssize_t k0 = 0; k0 < K4; k0 += kcb) {
        const ssize_t k1 = std::min(K4, k0 + kcb);
        const int16_t* bwk = nullptr;
        if constexpr (wide) {
          const i32* bcc = nullptr;
          bwk = wb->get(p, k0 / kcb, bp, k0, k1, bw, own_cc, &bcc);
        }
        if (wino) {  // one 32-column half (16 KB of B, L1) against every row block, then the other
          if constexpr (wide) {
            for (int h = 0; h < NPW / 32; ++h)
              for (ssize_t i = c0; i < c1; i += mr) {
                const int rows = int(std::min<ssize_t>(mr, c1 - i));
                const int16_t* ai = A + i * lda;
                i32* ti = tile + (i - c0) * NPW;
                if (rows == 3) mk_wino<3>(ai, lda, bwk, k0, k1, ti, h, h + 1);
                else if (rows == 2) mk_wino<2>(ai, lda, bwk, k0, k1, ti, h, h + 1);
                else mk_wino<1>(ai, lda, bwk, k0, k1, ti, h, h + 1);
              }
          }
          continue;
        }
        for (ssize_t i = c0; i < c1; i += mr)
          micro<AT>(kern, int(std::min<ssize_t>(mr, c1 - i)), A + i * lda, lda, bp, bwk, k0, k1, tile + (i - c0) * NPW);
      }
      for (ssize_t i = c0; i < c1; ++i) ep(i, j0, nj, tile + (i - c0) * NPW);
    }
  }
}

// One OpenMP region with no barrier inside, for A operands made row by row (the dynamic Linear's quantize, the
// packed GEMM's offset / int16 widening): work items are chunks of rows, each item makes its own rows with
// prep(i0, i1, A, lda, tmp) and runs them against every panel, handed out dynamically (a preempted thread holds up
// one item, not half the work). Below 2 row blocks per thread the items are column panels and prep runs on every
// row before the region. Fewer sync points is most of the speed on a loaded 2-core machine: each barrier waits for
// a descheduled thread's next time slice (4-8 ms against a 0.4-1.5 ms call). prep returns false to stop (the
// runner then returns false). tmp: a K-byte scratch row per thread.
template <typename AT, typename PREP, typename EP>
bool run_row_items(Kern kern, ssize_t M, ssize_t K, const i8* P, ssize_t N, const PREP& prep, const EP& ep) {
  const int mr = kern_mr(kern);
  const ssize_t K4 = (K + 3) / 4, MP = (M + mr - 1) / mr, NP = (N + NPW - 1) / NPW;
  const ssize_t lda = kern == Kern::avx2_wino ? wino_lda(K4) : a_stride(K4, int(sizeof(AT)));
  const int T = tl::n_threads();
  const bool by_rows = MP >= 2 * ssize_t(T);
  // row items: the same number per thread, at most 8 blocks (48 rows) each
  const ssize_t maxb = 48 / mr;
  const ssize_t nitems = by_rows ? ssize_t(T) * std::max<ssize_t>(1, (MP + T * maxb - 1) / (T * maxb)) : NP;
  // 64-byte aligned, like the widened B: the alignment of a plain new[] varies from process to process (glibc
  // serves it from the heap once a freed mmap chunk raised its mmap threshold)
  const size_t abytes = (size_t(padded_rows(M)) * lda * sizeof(AT) + 63) / 64 * 64;
  std::unique_ptr<AT[], void (*)(void*)> A(static_cast<AT*>(std::aligned_alloc(64, abytes)), std::free);
  if (!A) throw std::bad_alloc();
  std::atomic<bool> ok{true};
  const bool wide = std::is_same_v<AT, int16_t>;
  std::unique_ptr<WideB> wb(wide ? new WideB(NP, K4, wide_kcb(kern), kern == Kern::avx2_wino) : nullptr);
  if (!by_rows) {
    std::vector<uint8_t> tmp(static_cast<size_t>(K));
    if (!prep(ssize_t(0), M, A.get(), lda, tmp.data())) return false;
  }
#pragma omp parallel num_threads(T)
  {
    std::vector<i32> tile(size_t(48) * NPW);
    std::vector<int16_t> bw(wide ? size_t(KCBW) * NPW * 4 : 0);
    std::vector<uint8_t> tmp(by_rows ? static_cast<size_t>(K) : 0);
#pragma omp for schedule(dynamic, 1) nowait
    for (ssize_t it = 0; it < nitems; ++it) {
      if (by_rows) {
        const ssize_t i0 = std::min(M, MP * it / nitems * mr), i1 = std::min(M, MP * (it + 1) / nitems * mr);
        if (!prep(i0, i1, A.get(), lda, tmp.data())) ok = false;
        // each thread starts at its own panel (madd16: the threads then widen different pieces of B first
        // instead of racing for the same ones and each widening its own copy)
        const ssize_t rot = NP * ssize_t(tl::thread_id()) / T;
        if (ok) gemm_rows<AT>(kern, A.get(), lda, i0, i1, K4, P, N, 0, NP, tile.data(), bw.data(), wb.get(), ep, rot);
      } else {
        gemm_rows<AT>(kern, A.get(), lda, 0, M, K4, P, N, it, it + 1, tile.data(), bw.data(), wb.get(), ep);
      }
    }
  }
  return ok;
}

}  // namespace tl::q8
