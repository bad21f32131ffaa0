"""tl.memory — allocators over an arena (offsets, like device pointers), metrics, static planning, pooled tensors.

    alloc = tl.memory.CachingAllocator(64 << 20, backend="cpp")
    off = alloc.malloc(4096); x = alloc.view(off, (32, 32), "float32"); alloc.free(off); alloc.stats()

Allocators (each with backend="python" (the readable reference) or "cpp" (tinylearn._C.memory), same offsets for
the same trace): BumpAllocator, FirstFitAllocator, BestFitAllocator, BuddyAllocator, SlabAllocator,
CachingAllocator. Planner: plan, lower_bound. Compaction: plan_window, plan_greedy_ratio, apply_plan.
Traces: TraceRecorder, random_ops, replay_stats. pooled(alloc).
"""

from .base import STAT_KEYS, Allocator, align_up, external_fragmentation
from .buddy import BuddyAllocator, buddy_of, next_pow2, split_block
from .bump import BumpAllocator
from .caching import CachingAllocator, CachingConfig, allocation_size, round_size
from .compaction import CompactionPlan, apply_plan, holes, largest_free, plan_greedy_ratio, plan_window
from .estimate import estimate, measure_peak, model_state_bytes, transformer_memory
from .freelist import BestFitAllocator, FirstFitAllocator
from .planner import check_plan, lower_bound, plan, plan_greedy
from .pooled import TraceRecorder, count_numpy_allocations, pooled
from .slab import SlabAllocator
from .stream_ordered import stream_ordered_checksum
from .tensor_cache import ManualClock, TensorCache
from .trace import lifetimes_from_ops, ops_from_lifetimes, pair_ops, random_ops, replay_python, replay_stats
from .viz import plot_arena

ALLOCATORS = {
    "bump": BumpAllocator,
    "first_fit": FirstFitAllocator,
    "best_fit": BestFitAllocator,
    "buddy": BuddyAllocator,
    "slab": SlabAllocator,
    "caching": CachingAllocator,
}

__all__ = [
    "ALLOCATORS",
    "STAT_KEYS",
    "Allocator",
    "BestFitAllocator",
    "BuddyAllocator",
    "BumpAllocator",
    "CachingAllocator",
    "FirstFitAllocator",
    "ManualClock",
    "SlabAllocator",
    "TensorCache",
    "TraceRecorder",
    "align_up",
    "CachingConfig",
    "CompactionPlan",
    "apply_plan",
    "allocation_size",
    "buddy_of",
    "check_plan",
    "count_numpy_allocations",
    "external_fragmentation",
    "holes",
    "largest_free",
    "estimate",
    "lifetimes_from_ops",
    "lower_bound",
    "measure_peak",
    "model_state_bytes",
    "next_pow2",
    "ops_from_lifetimes",
    "pair_ops",
    "stream_ordered_checksum",
    "plan",
    "plan_greedy",
    "plan_greedy_ratio",
    "plan_window",
    "plot_arena",
    "pooled",
    "random_ops",
    "replay_python",
    "replay_stats",
    "round_size",
    "split_block",
    "transformer_memory",
]
