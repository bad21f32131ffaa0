// sparse.cpp — sparse x dense kernels for tinylearn.sparse (CSR / ELL / BSR), fp32 and fp64, OpenMP over rows.
//
// Formats (0-based, int64 row pointers, int32 column indices, see tinylearn/sparse/formats.py):
//   CSR  indptr[M+1], indices[nnz], data[nnz]: row i holds data[indptr[i]:indptr[i+1]] at columns indices[...]
//   ELL  indices[W, M], data[W, M] (column-major padded: slot k of row i is [k, i]; padding has column -1)
//   BSR  indptr[MB+1], indices[nb] (block columns), data[nb, R, C]
//
// Versions (each checked against the dense numpy product in tests/test_sparse.py):
//   csr_spmv        y = A x; one row per iteration, OpenMP over rows (dynamic chunks: rows have uneven length)
//   csr_spmm        Y = A B; row i: Y[i, :] = sum_k A[i,k] * B[k, :] as vectorised axpys over the full width of B.
//                   (A version tiled by 64 columns of B, accumulating in a local buffer, measured 3-8x slower
//                   here single-threaded at 50-99% sparsity for 1024^3, so it was dropped.)
//   ell_spmv        y = A x from the column-major ELL arrays (the GPU layout): blocks of 256 rows walk the slots in
//                   order so loads are contiguous; padding (column -1) still costs a load per slot
//   bsr_spmm        Y = A B with dense R x C blocks: each block is a small dense GEMM into the output rows
// Work: SpMV 2*nnz flops, SpMM 2*nnz*N flops, versus 2*M*K*N for the dense product.
#include "common.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Below this many multiply-adds a kernel runs on one thread: waking an OpenMP team costs more than it saves
// (and on an oversubscribed machine a barrier can wait a whole scheduler time slice).
constexpr int64_t kParallelMinWork = 1 << 17;

template <class T>
using arr = py::array_t<T, py::array::c_style | py::array::forcecast>;
using i64arr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using i32arr = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

using tl::shape_str;

// Validate a CSR triple against (M, K): indptr (M+1,) from 0 to nnz and monotone (O(M)), in-range columns (O(nnz),
// a read-only pass, much cheaper than the gathers of the product). Done before any compute, on every call: a
// tinylearn.sparse.CSR built with check=False reaches these kernels unvalidated.
void check_csr(const i64arr& indptr, const i32arr& indices, const py::array& data, int64_t M, int64_t K,
               const char* fn) {
  if (M < 0 || K < 0)
    tl::value_error(std::string(fn) + ": nrows must be >= 0, got " + std::to_string(M) + " (columns " +
                    std::to_string(K) + ")");
  if (indptr.ndim() != 1 || indptr.shape(0) != M + 1)
    tl::value_error(std::string(fn) + ": indptr must have shape (" + std::to_string(M + 1) + ",), got " +
                    shape_str(indptr));
  if (indices.ndim() != 1 || data.ndim() < 1 || indices.shape(0) != data.shape(0))
    tl::value_error(std::string(fn) + ": indices " + shape_str(indices) + " and data " + shape_str(data) +
                    " must have the same length");
  const int64_t* p = indptr.data();
  const int64_t nnz = indices.shape(0);
  if (p[0] != 0 || p[M] != nnz)
    tl::value_error(std::string(fn) + ": indptr must start at 0 and end at nnz=" + std::to_string(nnz) + ", got " +
                    std::to_string(p[0]) + " .. " + std::to_string(p[M]));
  for (int64_t i = 0; i < M; ++i)
    if (p[i + 1] < p[i]) tl::value_error(std::string(fn) + ": indptr decreases at row " + std::to_string(i));
  const int32_t* c = indices.data();
  for (int64_t k = 0; k < nnz; ++k)
    if (c[k] < 0 || c[k] >= K)
      tl::value_error(std::string(fn) + ": column index " + std::to_string(c[k]) + " out of range for " +
                      std::to_string(K) + " columns");
}

template <class T>
arr<T> csr_spmv(i64arr indptr, i32arr indices, arr<T> data, arr<T> x, int64_t M) {
  if (x.ndim() != 1) tl::value_error("csr_spmv: x must be 1-D, got shape " + shape_str(x));
  const int64_t K = x.shape(0);
  check_csr(indptr, indices, data, M, K, "csr_spmv");
  arr<T> y(M);
  const int64_t* p = indptr.data();
  const int32_t* c = indices.data();
  const T* v = data.data();
  const T* xv = x.data();
  T* yv = y.mutable_data();
  const bool par = indices.shape(0) > kParallelMinWork;
  py::gil_scoped_release release;
#pragma omp parallel for schedule(dynamic, 64) if (par)
  for (int64_t i = 0; i < M; ++i) {
    T acc = 0;
    for (int64_t k = p[i]; k < p[i + 1]; ++k) acc += v[k] * xv[c[k]];
    yv[i] = acc;
  }
  return y;
}

// Row-wise SpMM: Y[i, :] += a * B[c, :] over the full width N; the output row stays in L1 while the gathered rows
// of B stream through it (vectorised axpy).
template <class T>
arr<T> csr_spmm(i64arr indptr, i32arr indices, arr<T> data, arr<T> B, int64_t M) {
  if (B.ndim() != 2) tl::value_error("csr_spmm: B must be 2-D, got shape " + shape_str(B));
  const int64_t K = B.shape(0), N = B.shape(1);
  check_csr(indptr, indices, data, M, K, "csr_spmm");
  arr<T> Y({M, N});
  const int64_t* p = indptr.data();
  const int32_t* c = indices.data();
  const T* v = data.data();
  const T* b = B.data();
  T* y = Y.mutable_data();
  const bool par = indices.shape(0) * N > kParallelMinWork;
  py::gil_scoped_release release;
#pragma omp parallel for schedule(dynamic, 16) if (par)
  for (int64_t i = 0; i < M; ++i) {
    T* __restrict yrow = y + i * N;
    for (int64_t j = 0; j < N; ++j) yrow[j] = 0;
    for (int64_t k = p[i]; k < p[i + 1]; ++k) {
      const T a = v[k];
      const T* __restrict brow = b + int64_t(c[k]) * N;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) yrow[j] += a * brow[j];
    }
  }
  return Y;
}

template <class T>
arr<T> ell_spmv(i32arr indices, arr<T> data, arr<T> x) {
  if (indices.ndim() != 2 || data.ndim() != 2 || indices.shape(0) != data.shape(0) || indices.shape(1) != data.shape(1))
    tl::value_error("ell_spmv: indices " + shape_str(indices) + " and data " + shape_str(data) +
                    " must be equal 2-D (W, M)");
  if (x.ndim() != 1) tl::value_error("ell_spmv: x must be 1-D, got shape " + shape_str(x));
  const int64_t W = indices.shape(0), M = indices.shape(1), K = x.shape(0);
  const int32_t* c = indices.data();
  for (int64_t k = 0; k < W * M; ++k)
    if (c[k] < -1 || c[k] >= K)
      tl::value_error("ell_spmv: column index " + std::to_string(c[k]) + " out of range for " + std::to_string(K) +
                      " columns (padding is -1)");
  arr<T> y(M);
  const T* v = data.data();
  const T* xv = x.data();
  T* yv = y.mutable_data();
  const bool par = W * M > kParallelMinWork;
  py::gil_scoped_release release;
  // Column-major ELL on a CPU: walk slot by slot over a block of rows so that indices/data stream contiguously
  // (row-by-row traversal would jump M elements between slots: one cache line per load).
  constexpr int64_t RB = 256;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i0 = 0; i0 < M; i0 += RB) {
    const int64_t i1 = std::min(M, i0 + RB);
    T acc[RB];
    for (int64_t i = i0; i < i1; ++i) acc[i - i0] = 0;
    for (int64_t k = 0; k < W; ++k) {
      const int32_t* ck = c + k * M;
      const T* vk = v + k * M;
      for (int64_t i = i0; i < i1; ++i) {
        const int32_t col = ck[i];
        if (col >= 0) acc[i - i0] += vk[i] * xv[col];
      }
    }
    for (int64_t i = i0; i < i1; ++i) yv[i] = acc[i - i0];
  }
  return y;
}

template <class T>
arr<T> bsr_spmm(i64arr indptr, i32arr indices, arr<T> data, arr<T> B, int64_t M) {
  if (data.ndim() != 3) tl::value_error("bsr_spmm: data must be 3-D (nblocks, R, C), got shape " + shape_str(data));
  if (B.ndim() != 2) tl::value_error("bsr_spmm: B must be 2-D, got shape " + shape_str(B));
  const int64_t R = data.shape(1), C = data.shape(2), K = B.shape(0), N = B.shape(1);
  if (R <= 0 || C <= 0 || M % R != 0 || K % C != 0)
    tl::value_error("bsr_spmm: block " + std::to_string(R) + "x" + std::to_string(C) + " must divide the shape (" +
                    std::to_string(M) + ", " + std::to_string(K) + ")");
  const int64_t MB = M / R, KB = K / C;
  check_csr(indptr, indices, data, MB, KB, "bsr_spmm");
  arr<T> Y({M, N});
  const int64_t* p = indptr.data();
  const int32_t* c = indices.data();
  const T* v = data.data();
  const T* b = B.data();
  T* y = Y.mutable_data();
  const bool par = data.size() * N > kParallelMinWork;
  py::gil_scoped_release release;
#pragma omp parallel for schedule(dynamic, 4) if (par)
  for (int64_t ib = 0; ib < MB; ++ib) {
    T* yblk = y + ib * R * N;
    for (int64_t j = 0; j < R * N; ++j) yblk[j] = 0;
    for (int64_t k = p[ib]; k < p[ib + 1]; ++k) {
      const T* blk = v + k * R * C;
      const T* bb = b + int64_t(c[k]) * C * N;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t cc = 0; cc < C; ++cc) {
          const T a = blk[r * C + cc];
          const T* brow = bb + cc * N;
          T* yrow = yblk + r * N;
#pragma omp simd
          for (int64_t j = 0; j < N; ++j) yrow[j] += a * brow[j];
        }
    }
  }
  return Y;
}

}  // namespace

TL_REGISTER(sparse) {
  m.doc() = "sparse x dense kernels (CSR SpMV/SpMM, ELL SpMV, BSR SpMM), fp32/fp64, OpenMP over rows";
  // float64 overloads first: pybind11 tries overloads in order and forcecast would otherwise downcast doubles.
  m.def("csr_spmv", &csr_spmv<double>, py::arg("indptr"), py::arg("indices"), py::arg("data").noconvert(), py::arg("x"),
        py::arg("nrows"));
  m.def("csr_spmv", &csr_spmv<float>, py::arg("indptr"), py::arg("indices"), py::arg("data"), py::arg("x"),
        py::arg("nrows"), "y = A @ x for CSR A (indptr int64, indices int32)");
  m.def("csr_spmm", &csr_spmm<double>, py::arg("indptr"), py::arg("indices"), py::arg("data").noconvert(), py::arg("B"),
        py::arg("nrows"));
  m.def("csr_spmm", &csr_spmm<float>, py::arg("indptr"), py::arg("indices"), py::arg("data"), py::arg("B"),
        py::arg("nrows"), "Y = A @ B for CSR A, dense row-major B (row-wise axpy, OpenMP over rows)");
  m.def("ell_spmv", &ell_spmv<double>, py::arg("indices"), py::arg("data").noconvert(), py::arg("x"));
  m.def("ell_spmv", &ell_spmv<float>, py::arg("indices"), py::arg("data"), py::arg("x"),
        "y = A @ x for column-major padded ELL (indices/data shape (W, M), padding column -1)");
  m.def("bsr_spmm", &bsr_spmm<double>, py::arg("indptr"), py::arg("indices"), py::arg("data").noconvert(), py::arg("B"),
        py::arg("nrows"));
  m.def("bsr_spmm", &bsr_spmm<float>, py::arg("indptr"), py::arg("indices"), py::arg("data"), py::arg("B"),
        py::arg("nrows"), "Y = A @ B for BSR A (data (nblocks, R, C))");
}
