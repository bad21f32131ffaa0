"""``tl.profile``: an op-level profiler for tinylearn (torch.profiler-shaped), with FLOPs/bytes, a roofline
placement, Chrome traces, hardware counters and a hot-op re-tune trigger.

- ``profile(record_shapes=True, with_flops=True, counters=False, memory=False)`` -> ``Profile`` (recorder.py):
  hooks autograd Functions (forward and backward) and ``backends.dispatch``; ``record_function(name)`` user ranges.
- ``Profile.table()/key_averages()/events()/roofline()`` (table.py), ``export_chrome_trace(path)`` (trace.py).
- ``op_cost(name, shapes, ...)`` (flops.py): the FLOP/byte model.
- ``HardwareCounters``, ``SoftwareCounters``, ``RusageCounters``, ``counters_available`` (counters.py).
- ``HotspotMonitor`` (hotspots.py): hot ops running far below their roof -> a ``retune(op, shape)`` callback.
"""

from .counters import (
    CountersUnavailable,
    HardwareCounters,
    RusageCounters,
    SoftwareCounters,
    counters_available,
    software_counters,
)
from .events import Event
from .flops import op_cost
from .hotspots import HotspotDecision, HotspotMonitor, fastest_version_retune
from .recorder import Profile, profile, record_function

__all__ = [
    "CountersUnavailable",
    "Event",
    "HardwareCounters",
    "HotspotDecision",
    "HotspotMonitor",
    "Profile",
    "RusageCounters",
    "SoftwareCounters",
    "counters_available",
    "fastest_version_retune",
    "op_cost",
    "profile",
    "record_function",
    "software_counters",
]
