"""Collectives on real processes: ring / tree / recursive doubling / hierarchical all-reduce built on
torch.distributed point-to-point, a process launcher, the alpha-beta-gamma cost model, an event-driven
simulator, data-parallel helpers (bucketing, overlap) and gradient compression with error feedback.

    import tinylearn as tl
    results = tl.dist.launch(fn, 4)                      # fn(*args) on 4 local processes, per-rank results
    tl.dist.all_reduce(t, op="sum", algorithm="ring")    # inside a rank: in place, like dist.all_reduce
    tl.dist.cost_model.predict("ring", 1 << 20, 8, alpha_s=1e-5, beta_s_per_byte=1e-10)
    tl.dist.simulate("hierarchical", 1024, 1 << 26, topology=tl.dist.TwoLevel(node_size=8))
    with tl.dist.keep_awake.keep_cores_awake(): ...      # SCHED_IDLE spinners: cores never idle while timing

Naming note: ``launch(..., backend="gloo"|"nccl"|"mpi")`` keeps torch.distributed's meaning of ``backend`` (the
process-group transport), not a ``tinylearn.backends`` kernel backend; the algorithm is chosen with
``algorithm=``. The topic has no multi-backend kernels, so nothing here registers in ``tinylearn.backends``.
"""

from . import cost_model, keep_awake
from .collectives import (
    ALGORITHMS,
    OPS,
    all_gather,
    all_reduce,
    bounds,
    broadcast,
    default_node_size,
    recursive_doubling_partner,
    reduce_scatter,
    ring_schedule,
)
from .launch import launch
from .simulator import TwoLevel, simulate

__all__ = [
    "ALGORITHMS",
    "OPS",
    "TwoLevel",
    "all_gather",
    "all_reduce",
    "bounds",
    "broadcast",
    "cost_model",
    "default_node_size",
    "keep_awake",
    "launch",
    "recursive_doubling_partner",
    "reduce_scatter",
    "ring_schedule",
    "simulate",
]
