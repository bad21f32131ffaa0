"""Device models for the simulator and the power/thermal controllers -- a MODEL, never a measurement.

This VM has no GPU and exposes no power, frequency or thermal controls (no RAPL, no cpufreq, no cgroup limits),
so every watt, degree and clock in topic 18 comes from the models below, and is labelled MODEL wherever shown.
Their parameters are written down with where they come from:

    peak_tflops, mem_bw_gbs, mem_gb, tdp_w, f_max_mhz   vendor datasheets (NVIDIA A100 SXM4 40GB: 19.5 FP32 /
                                                      312 FP16-tensor TFLOPS, 1555 GB/s, 400 W, boost 1410 MHz;
                                                      H100 SXM5: 67 FP32 / 989 FP16-tensor TFLOPS (dense),
                                                      3350 GB/s, 80 GB, 700 W, boost 1980 MHz)
    idle_w                                            an ASSUMPTION: typical nvidia-smi idle readings (~15% of TDP)
    f_min_mhz, f_steps                                an ASSUMPTION: a 15-step ladder from ~40% to 100% of boost
    thermal_r_k_per_w, thermal_c_j_per_k              an ASSUMPTION: steady state 45 K above ambient at TDP, time
                                                      constant R*C = 30 s (first-order lumped model)
    throttle_c                                        an ASSUMPTION: the slowdown temperature nvidia-smi reports is
                                                      in the high 80s C for these parts

Power:   P(f, u) = idle + (tdp - idle) * u * (f / f_max)^gamma,  gamma = 3 (dynamic power C V^2 f with V ~ f).
Time:    a step of F FLOPs and B bytes at clock f takes max(F / (peak * f / f_max), B / bw) (the roofline; memory
         traffic does not scale with the core clock).
Thermal: dT/dt = (P R - (T - T_amb)) / (R C)  (one RC stage: T relaxes to T_amb + P R with time constant R C).

``DeviceSpec.cpu_core(step_s)`` is the one spec calibrated on this machine: a core of this VM whose speed is set so
a measured step time is reproduced (``sim.py`` calibrates it from the real runs); it has no power model of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GAMMA = 3.0


@dataclass(frozen=True)
class DeviceSpec:
    """One device type (see the module docstring for every field's source)."""

    name: str
    peak_tflops: float
    mem_bw_gbs: float
    mem_gb: float
    tdp_w: float
    idle_w: float
    f_max_mhz: float
    f_min_mhz: float
    f_steps: int = 15
    thermal_r_k_per_w: float = 0.1125
    thermal_c_j_per_k: float = 266.7
    ambient_c: float = 30.0
    throttle_c: float = 87.0
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "mem_bw_gbs", "mem_gb", "tdp_w", "f_max_mhz", "f_min_mhz"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: expected a finite number > 0, got {v!r} (device {self.name!r})")
        if not 0 <= self.idle_w < self.tdp_w:
            raise ValueError(f"idle_w: expected 0 <= idle_w < tdp_w={self.tdp_w}, got {self.idle_w!r}")
        if self.f_min_mhz > self.f_max_mhz:
            raise ValueError(f"f_min_mhz: {self.f_min_mhz} is above f_max_mhz={self.f_max_mhz}")
        if not isinstance(self.f_steps, int) or self.f_steps < 1:
            raise ValueError(f"f_steps: expected an int >= 1, got {self.f_steps!r}")

    # ------------------------------------------------------------------------------------------- the models
    def freqs(self) -> list[float]:
        """The DVFS ladder (MHz), ascending, f_min .. f_max."""
        if self.f_steps == 1:
            return [self.f_max_mhz]
        d = (self.f_max_mhz - self.f_min_mhz) / (self.f_steps - 1)
        return [self.f_min_mhz + i * d for i in range(self.f_steps)]

    def power_w(self, f_mhz: float, util: float) -> float:
        """MODEL: board power at clock ``f_mhz`` and utilisation ``util`` in [0, 1]."""
        _check_f(self, f_mhz)
        if not 0.0 <= util <= 1.0:
            raise ValueError(f"util: expected a utilisation in [0, 1], got {util!r}")
        return self.idle_w + (self.tdp_w - self.idle_w) * util * (f_mhz / self.f_max_mhz) ** GAMMA

    def step_time_s(self, flops: float, nbytes: float, f_mhz: float | None = None) -> float:
        """MODEL: seconds for a step of ``flops`` FLOPs moving ``nbytes`` bytes at clock ``f_mhz`` (roofline)."""
        f = self.f_max_mhz if f_mhz is None else f_mhz
        _check_f(self, f)
        if flops < 0 or nbytes < 0:
            raise ValueError(f"flops/nbytes: expected >= 0, got {flops!r}, {nbytes!r}")
        compute = flops / (self.peak_tflops * 1e12 * f / self.f_max_mhz)
        return max(compute, nbytes / (self.mem_bw_gbs * 1e9))

    def steady_temp_c(self, power_w: float) -> float:
        """MODEL: the temperature a constant ``power_w`` settles at."""
        return self.ambient_c + power_w * self.thermal_r_k_per_w

    def temp_after(self, temp_c: float, power_w: float, dt_s: float) -> float:
        """MODEL: the first-order thermal step (exact solution of the RC ODE over ``dt_s``)."""
        if dt_s < 0:
            raise ValueError(f"dt_s: expected >= 0, got {dt_s!r}")
        tau = self.thermal_r_k_per_w * self.thermal_c_j_per_k
        target = self.steady_temp_c(power_w)
        return target + (temp_c - target) * math.exp(-dt_s / tau)

    def scaled(self, speed: float) -> DeviceSpec:
        """This device with ``speed`` x the compute and bandwidth (a heterogeneous cluster's slower/faster part)."""
        if not speed > 0:
            raise ValueError(f"speed: expected > 0, got {speed!r}")
        return replace(self, name=f"{self.name}x{speed:g}", peak_tflops=self.peak_tflops * speed,
                       mem_bw_gbs=self.mem_bw_gbs * speed)  # fmt: skip

    @staticmethod
    def cpu_core(step_s: float, name: str = "vm-core") -> DeviceSpec:
        """A core of this VM, calibrated so that a 1-GFLOP step takes ``step_s`` seconds (power fields nominal)."""
        if not step_s > 0:
            raise ValueError(f"step_s: expected > 0, got {step_s!r}")
        why = "calibrated on this VM's measured step time; power fields nominal (no RAPL here)"
        return DeviceSpec(name, peak_tflops=1e-3 / step_s, mem_bw_gbs=1e9, mem_gb=8.0, tdp_w=15.0, idle_w=2.0,
                          f_max_mhz=1.0, f_min_mhz=1.0, f_steps=1, source=why)  # fmt: skip


def _check_f(spec: DeviceSpec, f_mhz: float) -> None:
    if not spec.f_min_mhz - 1e-9 <= f_mhz <= spec.f_max_mhz + 1e-9:
        raise ValueError(f"f_mhz: {f_mhz!r} is outside [{spec.f_min_mhz}, {spec.f_max_mhz}] MHz of {spec.name}")


A100 = DeviceSpec("A100-SXM4-40GB", peak_tflops=312.0, mem_bw_gbs=1555.0, mem_gb=40.0, tdp_w=400.0, idle_w=60.0,
                  f_max_mhz=1410.0, f_min_mhz=555.0, thermal_r_k_per_w=45 / 400, thermal_c_j_per_k=30 / (45 / 400),
                  source="NVIDIA A100 datasheet (FP16 tensor dense, HBM2 bandwidth, SXM4 TDP, boost clock); idle, "
                  "DVFS ladder and thermal constants are assumptions")  # fmt: skip
H100 = DeviceSpec("H100-SXM5-80GB", peak_tflops=989.0, mem_bw_gbs=3350.0, mem_gb=80.0, tdp_w=700.0, idle_w=100.0,
                  f_max_mhz=1980.0, f_min_mhz=780.0, thermal_r_k_per_w=45 / 700, thermal_c_j_per_k=30 / (45 / 700),
                  source="NVIDIA H100 datasheet (FP16 tensor dense, HBM3 bandwidth, SXM5 TDP, boost clock); idle, "
                  "DVFS ladder and thermal constants are assumptions")  # fmt: skip
DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (A100, H100)}
