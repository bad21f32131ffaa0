// autograd_index_add.cpp — out[idx[i]] += rows[i] for i = 0, 1, ... in order: np.add.at(out, idx, rows) on a 2-D
// C-contiguous float32/float64 out [n, d] with rows [len(idx), d], for the embedding and integer-indexing VJPs and
// MoE's scatter (tinylearn/autograd/ops_index.py: op "autograd.index_add_rows").
//
// One pass in index order, so every output row sums its contributions in the order np.add.at does (bitwise the
// same result). numpy's add.at adds one element at a time (1.1 ms for 2048 rows of 64 floats); the CSR product
// that replaced it (scipy: bincount + argsort + a sparse-dense product) costs ~50-80 us of set-up per call for
// that size; this loop is a few microseconds. Every index is checked before anything is written (a bad one raises
// ValueError naming it and out is untouched). Serial: the scatter's rows collide, and the sizes where it is used
// (a batch of tokens) are too small for threads to pay.
#include <cstdint>
#include <string>

#include "common.h"
#include "registry.h"

namespace py = pybind11;

namespace {

template <typename T>
void index_add_rows(py::array_t<T, py::array::c_style> out, py::array_t<int64_t, py::array::c_style | py::array::forcecast> idx,
                    py::array_t<T, py::array::c_style | py::array::forcecast> rows) {
  // out: exactly this dtype and C order, never a converted copy (the additions must land in the caller's array)
  if (out.ndim() != 2 || !out.writeable())
    tl::value_error("out: expected a writable C-contiguous 2-D array, got ndim " + std::to_string(out.ndim()));
  if (idx.ndim() != 1) tl::value_error("idx: expected a 1-D integer array, got ndim " + std::to_string(idx.ndim()));
  const int64_t n = out.shape(0), d = out.shape(1), m = idx.shape(0);
  if (rows.ndim() != 2 || rows.shape(0) != m || rows.shape(1) != d)
    tl::value_error("rows: expected shape [" + std::to_string(m) + ", " + std::to_string(d) + "] (one row per index)");
  const int64_t* pi = idx.data();
  for (int64_t i = 0; i < m; ++i)
    if (pi[i] < 0 || pi[i] >= n)
      tl::value_error("idx: index " + std::to_string(pi[i]) + " at position " + std::to_string(i) +
                      " is out of range [0, " + std::to_string(n) + ")");
  T* po = out.mutable_data();
  const T* pr = rows.data();
  py::gil_scoped_release release;
  for (int64_t i = 0; i < m; ++i) {
    T* o = po + pi[i] * d;
    const T* r = pr + i * d;
    for (int64_t j = 0; j < d; ++j) o[j] += r[j];
  }
}

}  // namespace

TL_REGISTER(autograd) {
  m.def("index_add_rows", &index_add_rows<float>, py::arg("out"), py::arg("idx"), py::arg("rows"),
        "out[idx[i]] += rows[i] in index order (np.add.at) for C-contiguous float32 out [n, d], rows [len(idx), d]");
  m.def("index_add_rows", &index_add_rows<double>, py::arg("out"), py::arg("idx"), py::arg("rows"));
}
