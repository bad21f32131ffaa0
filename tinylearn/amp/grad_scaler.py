"""``tl.amp.GradScaler``: dynamic loss scaling, the same state machine as ``torch.amp.GradScaler``.

Why: fp16 has 5 exponent bits; its smallest subnormal is 2^-24 ~ 5.96e-8 and round-to-nearest-even sends every
|g| <= 2^-25 ~ 2.98e-8 to zero (2^-25 itself is a tie and rounds to the even code, 0). Multiplying the loss
by S shifts every gradient up by log2(S) binades (the chain rule is linear in the upstream gradient), and
unscaling by 1/S in fp32 before the optimizer step restores the true values.

The update rule (torch's _amp_update_scale_), after each iteration:

    if any gradient was Inf/NaN:  skip optimizer.step();  S *= backoff_factor;  tracker = 0
    else:                         tracker += 1
                                  if tracker == growth_interval:  S *= growth_factor (if finite);  tracker = 0

The scale is kept as a float32 like torch's scale tensor, so the sequences agree exactly.

Fallback to a safe precision (not in torch): with ``fallback_after=N``, N consecutive skipped (Inf/NaN) steps set
``fell_back`` (sticky). The training loop then leaves autocast (``autocast_dtype(requested)`` returns None): a
model whose fp16 step keeps overflowing even after N halvings of S trains on in fp32 instead of skipping forever.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import Tensor
from .args import as_int, bool_arg, is_int, positive_real, real_arg


class GradScaler:
    def __init__(
        self,
        init_scale: float = 65536.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        fallback_after: int | None = None,
    ) -> None:
        init_scale = positive_real(init_scale, "init_scale")
        if not real_arg(growth_factor, "growth_factor") > 1.0:
            raise ValueError(f"growth_factor: must be > 1.0, got {growth_factor}")
        if not 0.0 < real_arg(backoff_factor, "backoff_factor") < 1.0:
            raise ValueError(f"backoff_factor: must be in (0, 1), got {backoff_factor}")
        growth_interval = as_int(growth_interval, "growth_interval", min=1)
        enabled = bool_arg(enabled, "enabled")
        self._scale = np.float32(init_scale)
        self.growth_factor = np.float32(growth_factor)
        self.backoff_factor = np.float32(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.enabled = bool(enabled)
        self._growth_tracker = 0
        # id(optimizer) -> {"stage": "unscaled" | "stepped", "found_inf": bool}; cleared by update()
        self._opt_state: dict[int, dict[str, Any]] = {}
        self.n_skipped = 0
        if fallback_after is not None and (not is_int(fallback_after) or fallback_after < 1):
            raise ValueError(f"fallback_after: expected a positive int or None, got {fallback_after!r}")
        self.fallback_after = None if fallback_after is None else int(fallback_after)
        self.consecutive_skips = 0  # Inf/NaN steps in a row (reset by a clean step)
        self.fell_back = False  # set once consecutive_skips reaches fallback_after; never cleared

    def autocast_dtype(self, requested: Any) -> Any:
        """The autocast dtype the next step should use: ``requested`` until the scaler fell back, then None."""
        return None if self.fell_back else requested

    # -- the four calls of a training step ------------------------------------------------------------------
    def scale(self, loss: Tensor) -> Tensor:
        """loss * S (differentiable, so backward produces S-times-larger gradients)."""
        if not isinstance(loss, Tensor):
            raise TypeError(f"loss: expected a tinylearn Tensor, got {type(loss).__name__}")
        if not self.enabled:
            return loss
        return loss * float(self._scale)

    def _params(self, optimizer: Any) -> list[Tensor]:
        groups = getattr(optimizer, "param_groups", None)
        if groups is None:
            raise TypeError(f"optimizer: expected a tinylearn optimizer, got {type(optimizer).__name__}")
        return [p for g in groups for p in g["params"]]

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients of ``optimizer``'s parameters by S in place (fp32 math) and record Inf/NaN."""
        if not self.enabled:
            return
        params = self._params(optimizer)
        st = self._opt_state.setdefault(id(optimizer), {"stage": "ready", "found_inf": False})
        if st["stage"] == "unscaled":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if st["stage"] == "stepped":
            raise RuntimeError("unscale_() is being called after step().")
        inv = np.float32(np.float64(1.0) / np.float64(self._scale))  # torch: scale.double().reciprocal().float()
        found = False
        for p in params:
            if p.grad is None:
                continue
            g = p.grad.data
            if not np.isfinite(g).all():
                found = True
            g32 = g.astype(np.float32) * inv
            p.grad.data = g32.astype(g.dtype) if g.dtype != np.float32 else g32
        st["stage"], st["found_inf"] = "unscaled", found

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """unscale_ (if not done yet), then optimizer.step() unless a gradient was Inf/NaN (skipped step).

        Once per optimizer between two ``update()`` calls, as in torch (a second call raises RuntimeError)."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        st = self._opt_state.get(id(optimizer))
        if st is not None and st["stage"] == "stepped":
            raise RuntimeError("step() has already been called since the last update().")
        if st is None or st["stage"] != "unscaled":
            self.unscale_(optimizer)
            st = self._opt_state[id(optimizer)]
        st["stage"] = "stepped"
        if st["found_inf"]:
            self.n_skipped += 1
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | None = None) -> None:
        """Back off on Inf/NaN, grow after ``growth_interval`` clean steps; resets the per-step state."""
        if not self.enabled:
            return
        if new_scale is not None:
            self._scale = np.float32(positive_real(new_scale, "new_scale"))
        else:
            if not self._opt_state:
                raise RuntimeError("update: no inf checks were recorded (call step(optimizer) first)")
            found_inf = any(s["found_inf"] for s in self._opt_state.values())
            self.consecutive_skips = self.consecutive_skips + 1 if found_inf else 0
            if self.fallback_after is not None and self.consecutive_skips >= self.fallback_after:
                self.fell_back = True
            self._scale, self._growth_tracker = update_scale(
                self._scale,
                self._growth_tracker,
                found_inf,
                self.growth_factor,
                self.backoff_factor,
                self.growth_interval,
            )
        self._opt_state = {}

    def get_scale(self) -> float:
        return float(self._scale) if self.enabled else 1.0

    def get_growth_tracker(self) -> int:
        return self._growth_tracker

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": float(self._scale),
            "growth_factor": float(self.growth_factor),
            "backoff_factor": float(self.backoff_factor),
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state: expected a dict from state_dict(), got {type(state).__name__}")
        keys = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
        missing = sorted(keys - set(state))
        if missing:
            raise ValueError(f"state: missing {', '.join(missing)} (expected a dict from GradScaler.state_dict())")
        positive_real(state["scale"], "state['scale']")
        self._scale = np.float32(state["scale"])
        self.growth_factor = np.float32(state["growth_factor"])
        self.backoff_factor = np.float32(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


def update_scale(
    scale: Any, tracker: int, found_inf: bool, growth_factor: Any, backoff_factor: Any, growth_interval: int
) -> tuple[np.float32, int]:
    """One step of the update rule on a float32 scale: returns (new scale, new growth tracker)."""
    if not (np.isfinite(real_arg(scale, "scale")) and scale >= 0):  # 0 is reachable: backoffs underflow
        raise ValueError(f"scale: must be a finite number >= 0, got {scale!r}")
    tracker = as_int(tracker, "tracker", min=0)
    found_inf = bool_arg(found_inf, "found_inf")
    growth_interval = as_int(growth_interval, "growth_interval", min=1)
    if not positive_real(growth_factor, "growth_factor") > 1.0:
        raise ValueError(f"growth_factor: must be > 1.0, got {growth_factor}")
    if not 0.0 < real_arg(backoff_factor, "backoff_factor") < 1.0:
        raise ValueError(f"backoff_factor: must be in (0, 1), got {backoff_factor}")
    scale = np.float32(scale)
    if found_inf:
        return np.float32(scale * np.float32(backoff_factor)), 0
    tracker += 1
    if tracker == growth_interval:
        grown = np.float32(scale * np.float32(growth_factor))
        return (grown if np.isfinite(grown) else scale), 0
    return scale, tracker
