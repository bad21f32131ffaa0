"""Hardware and software performance counters through Linux ``perf_event_open`` (ctypes, no perf binary needed).

Mechanism: ``syscall(__NR_perf_event_open, &attr, pid=0, cpu=-1, group_fd=-1, flags=0)`` opens one counter for the
calling thread; ``attr`` is a ``struct perf_event_attr`` (type, size, config, ..., read_format, flag bits) packed by
hand. The counter starts disabled, ``ioctl(PERF_EVENT_IOC_RESET/ENABLE)`` at ``__enter__``, ``DISABLE`` at
``__exit__``, then ``read`` returns three u64: value, time_enabled, time_running
(``PERF_FORMAT_TOTAL_TIME_ENABLED | _RUNNING``). When the PMU is multiplexed (more events than hardware counters)
running < enabled and the count is scaled by enabled / running (the ``scaled`` flag says so).

- ``HardwareCounters()``: PERF_TYPE_HARDWARE cycles, instructions, cache-references, cache-misses, branch-misses
  (user space only: ``exclude_kernel`` lets it work at ``perf_event_paranoid`` <= 2). A VM or container often has
  no virtual PMU (ENOENT / EOPNOTSUPP) or a seccomp filter / paranoid level that refuses the syscall (EPERM /
  EACCES): then ``CountersUnavailable`` names the errno and the paranoid level.
- ``SoftwareCounters()``: PERF_TYPE_SOFTWARE task-clock, page-faults, context-switches: kernel-maintained, so they
  work wherever the syscall itself is allowed, PMU or not.
- ``RusageCounters()``: ``resource.getrusage`` deltas (minor/major faults, voluntary/involuntary context switches,
  user/system CPU time), keys prefixed ``rusage:``: always available, whole-process, coarse.
- ``counters_available()`` -> (bool, reason) probes the hardware counters once (cached).

Only the calling thread is counted (pid=0, no ``inherit``): work done by an already running BLAS/OpenMP pool is not
included — run with one thread (OMP_NUM_THREADS=1) when you read cycles of a kernel.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import functools
import os
import platform
import resource
import struct
import time
from typing import Any

__all__ = [
    "CountersUnavailable",
    "HardwareCounters",
    "RusageCounters",
    "SoftwareCounters",
    "counters_available",
    "perf_event_paranoid",
    "software_counters",
]

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241}
PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
HARDWARE_EVENTS = {  # PERF_COUNT_HW_*
    "cycles": 0,
    "instructions": 1,
    "cache-references": 2,
    "cache-misses": 3,
    "branch-misses": 5,
}
SOFTWARE_EVENTS = {"task-clock": 1, "page-faults": 2, "context-switches": 3}  # PERF_COUNT_SW_*
_FORMAT_TIMES = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
_FLAGS = 1 | (1 << 5) | (1 << 6)  # disabled, exclude_kernel, exclude_hv
_ATTR_SIZE = 72  # PERF_ATTR_SIZE_VER1: every field we set lies in it
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403


class CountersUnavailable(RuntimeError):
    """The counters cannot be opened here; the message says why (errno, perf_event_paranoid, architecture)."""


def perf_event_paranoid() -> int | None:
    """/proc/sys/kernel/perf_event_paranoid (-1 all allowed ... 2 user-space only own process, 3+ Debian: off)."""
    try:
        with open("/proc/sys/kernel/perf_event_paranoid") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _reason(err: int, what: str) -> str:
    par = perf_event_paranoid()
    hint = {
        _errno.ENOENT: "no such event: no (virtual) PMU exposes it (typical of a VM or container)",
        _errno.EOPNOTSUPP: "not supported by this PMU (typical of a VM)",
        _errno.EACCES: "permission denied (perf_event_paranoid too high or no CAP_PERFMON)",
        _errno.EPERM: "operation not permitted (seccomp filter of the container, or perf_event_paranoid)",
        _errno.ENOSYS: "perf_event_open is not implemented by this kernel",
        _errno.EINVAL: "invalid perf_event_attr for this kernel",
    }.get(err, os.strerror(err))
    return f"{what}: perf_event_open failed with {_errno.errorcode.get(err, err)} ({hint}); perf_event_paranoid={par}"


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _open(type_: int, config: int, what: str) -> int:
    nr = _NR_PERF_EVENT_OPEN.get(platform.machine().lower())
    if nr is None:
        raise CountersUnavailable(f"{what}: no perf_event_open syscall number for architecture {platform.machine()!r}")
    attr = struct.pack("<IIQQQQQ", type_, _ATTR_SIZE, config, 0, 0, _FORMAT_TIMES, _FLAGS).ljust(128, b"\0")
    buf = ctypes.create_string_buffer(attr, 128)
    fd = _libc().syscall(nr, buf, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0))
    if fd < 0:
        raise CountersUnavailable(_reason(ctypes.get_errno(), what))
    return int(fd)


class _PerfGroup:
    """Counters opened one fd each; ``__enter__`` returns the dict that ``__exit__`` fills with the counts."""

    type_: int = PERF_TYPE_HARDWARE
    table: dict[str, int] = HARDWARE_EVENTS
    kind = "hardware"

    def __init__(self, events: tuple[str, ...] | None = None) -> None:
        names = tuple(self.table) if events is None else tuple(events)
        for e in names:
            if e not in self.table:
                raise ValueError(f"events: unknown {self.kind} event {e!r}; known: {list(self.table)}")
        self.events = names
        self._fds: list[int] = []
        self.values: dict[str, Any] = {}

    def __enter__(self) -> dict[str, Any]:
        try:
            for e in self.events:
                self._fds.append(_open(self.type_, self.table[e], f"{self.kind} counter {e!r}"))
        except CountersUnavailable:
            self._close()
            raise
        for fd in self._fds:
            fcntl.ioctl(fd, _IOC_RESET, 0)
            fcntl.ioctl(fd, _IOC_ENABLE, 0)
        return self.values

    def __exit__(self, *exc: object) -> None:
        scaled = False
        for fd in self._fds:
            fcntl.ioctl(fd, _IOC_DISABLE, 0)
        for e, fd in zip(self.events, self._fds):
            value, enabled, running = struct.unpack("<QQQ", os.read(fd, 24))
            if running and running < enabled:
                value, scaled = int(value * enabled / running), True
            self.values[e] = value if running or not enabled else None
        self.values["source"] = f"perf_event_open ({self.kind})"
        self.values["scaled"] = scaled
        self._close()

    def _close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class HardwareCounters(_PerfGroup):
    """``with HardwareCounters() as c: ...`` -> c = {"cycles": n, "instructions": n, ..., "source", "scaled"}.

    Raises ``CountersUnavailable`` (with the reason) at ``__enter__`` when the PMU cannot be opened."""


class SoftwareCounters(_PerfGroup):
    """PERF_TYPE_SOFTWARE task-clock (ns), page-faults, context-switches; no PMU needed, only the syscall."""

    type_ = PERF_TYPE_SOFTWARE
    table = SOFTWARE_EVENTS
    kind = "software"


class RusageCounters:
    """``resource.getrusage(RUSAGE_SELF)`` deltas (whole process), keys labelled ``rusage:...``: always works."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def __enter__(self) -> dict[str, Any]:
        self._r0, self._t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        return self.values

    def __exit__(self, *exc: object) -> None:
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        r0 = self._r0
        self.values.update(
            {
                "rusage:minor_faults": r1.ru_minflt - r0.ru_minflt,
                "rusage:major_faults": r1.ru_majflt - r0.ru_majflt,
                "rusage:voluntary_ctx_switches": r1.ru_nvcsw - r0.ru_nvcsw,
                "rusage:involuntary_ctx_switches": r1.ru_nivcsw - r0.ru_nivcsw,
                "rusage:user_s": r1.ru_utime - r0.ru_utime,
                "rusage:system_s": r1.ru_stime - r0.ru_stime,
                "wall_s": time.perf_counter() - self._t0,
                "source": "resource.getrusage (process-wide)",
            }
        )


@functools.cache
def counters_available() -> tuple[bool, str]:
    """(True, "ok: ...") when the hardware counters open here, else (False, reason naming errno and paranoid)."""
    try:
        with HardwareCounters(("cycles", "instructions")) as c:
            sum(range(1000))
    except CountersUnavailable as e:
        return False, str(e)
    except OSError as e:  # ioctl/read refused after a successful open
        return False, f"hardware counters: {e}; perf_event_paranoid={perf_event_paranoid()}"
    return True, f"ok: cycles={c['cycles']} instructions={c['instructions']} ({c['source']})"


@functools.cache
def software_available() -> tuple[bool, str]:
    try:
        with SoftwareCounters(("task-clock",)):
            pass
    except CountersUnavailable as e:
        return False, str(e)
    return True, "ok"


def software_counters() -> SoftwareCounters | RusageCounters:
    """The best always-working counter set: perf software events when the syscall is allowed, else getrusage."""
    return SoftwareCounters() if software_available()[0] else RusageCounters()
