"""The same ring all-reduce on mpi4py (Open MPI) as a cross-check of the torch.distributed version.

    mpirun --allow-run-as-root --oversubscribe -np 3 python -m tinylearn.dist.mpi_ring

Reduce-scatter then all-gather with ``Sendrecv`` (chunk (r-s) mod p out, (r-s-1) mod p in), numpy buffers;
every rank checks the result against ``comm.Allreduce`` and rank 0 prints one line per case and "mpi ring OK".
"""

from __future__ import annotations

import numpy as np

from .collectives import bounds, ring_schedule


def ring_allreduce_mpi(comm, x: np.ndarray) -> np.ndarray:
    """In-place sum all-reduce of the 1-D contiguous array ``x`` over ``comm`` with the ring schedule."""
    p, r = comm.Get_size(), comm.Get_rank()
    if p == 1 or x.size == 0:
        return x
    segs = bounds(x.size, p)
    buf = np.empty(max(b - a for a, b in segs), dtype=x.dtype)
    nxt, prv = (r + 1) % p, (r - 1) % p
    for s in range(2 * (p - 1)):
        send_c, recv_c = ring_schedule(r, s, p)
        (sa, sb), (ra, rb) = segs[send_c], segs[recv_c]
        comm.Sendrecv(
            np.ascontiguousarray(x[sa:sb]), dest=nxt, sendtag=s, recvbuf=buf[: rb - ra], source=prv, recvtag=s
        )
        if s < p - 1:
            x[ra:rb] += buf[: rb - ra]
        else:
            x[ra:rb] = buf[: rb - ra]
    return x


def main() -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    ok = True
    for n in (0, 1, 7, 13, 1009, 100_003):
        for dtype in (np.float64, np.int64):
            x = (np.arange(n) % 17 * (r + 1)).astype(dtype)
            ref = np.empty_like(x)
            comm.Allreduce(x, ref, op=MPI.SUM)
            ring_allreduce_mpi(comm, x)
            same = bool(np.array_equal(x, ref))
            ok &= same
            if r == 0:
                print(f"n={n} {np.dtype(dtype).name}: {'match' if same else 'MISMATCH'}")
    ok = comm.allreduce(ok, op=MPI.LAND)
    if r == 0:
        print("mpi ring OK" if ok else "mpi ring FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
