"""Sparse formats and kernels: CSR, ELL (column-major padded), BSR; SpMV/SpMM in C++ (OpenMP), numba and numpy.

    A = tl.sparse.CSR.from_dense(w)      # w: 2-D array, zeros dropped
    y = A.matmul(x)                       # x (K,) -> SpMV, x (K, N) -> SpMM; backend=None|"numpy"|"numba"|"cpp"
    w2 = A.to_dense()                     # exact round trip

One file per format (csr.py, ell.py, bsr.py; shared checks and dispatch in base.py); each format's ``matmul`` is the
op ``sparse.<format>_matmul`` in ``tinylearn.backends`` (``backend=None``: the fastest available for the input).

The CUDA CSR SpMV kernels (scalar: one thread per row; vector: one warp per row) are in
cuda_src/sparse_csr_spmv.cu, registered as the ``cuda`` backend of ``sparse.csr_matmul`` (versions scalar, vector;
GPU only, used only when named: ``A.matmul(x, backend="cuda")``, see sparse/cuda.py); ``tinylearn.sparse.cuda_sim``
holds the scalar one in numba.cuda for the simulator.
"""

from .bsr import BSR
from .csr import CSR
from .ell import ELL

__all__ = ["BSR", "CSR", "ELL"]
