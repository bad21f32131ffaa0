"""Search spaces, declared next to the kernels they tune; ``tinylearn.tune`` searches them.

A kernel module declares, beside its ``backends.register`` calls, the knobs of one op and how to run a
configuration of them::

    tunable.declare(tunable.Space(
        op="gemm.matmul",
        params=(Param("isa", ("avx512", "avx2", "scalar")), Param("mc", (48, 96, 144, 192)), ...),
        build=lambda cfg: (lambda a, b: _C.gemm.matmul(a, b, "parallel", cfg["isa"], mc=cfg["mc"], ...)),
        shape_of=lambda a, b: {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1]},
        make_args=lambda shape, rng: ((rng.standard_normal(...), ...), {}),
        default=lambda shape: {...},          # what backend=None runs without a tuned record
        valid=lambda cfg, shape: ...,         # constraints (an ISA this CPU lacks, a tile larger than the problem)
    ))

A configuration is a plain dict ``{param: value}``. A shape is a dict of named sizes (``{"M": 256, ...}``); the
*shape class* a tuned choice is stored under rounds every size up to a power of two (``class_of``), so one search
serves every shape of the class. ``Space.features`` encodes (configuration, shape) as numbers for a learned cost
model (log2 of sizes and integer knobs, one-hot categories, and the derived ratios a space may add).

The registry here is data only: ``tinylearn.tune`` times configurations, stores records and installs the provider
that ``backends.resolve`` consults for ``backend=None`` calls.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import backends

Config = dict[str, Any]
Shape = dict[str, int]


@dataclass(frozen=True)
class Param:
    """One knob: its name and its allowed values, in order (integers ascending: neighbours are adjacent values)."""

    name: str
    values: tuple

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: a parameter name must be an identifier, got {self.name!r}")
        if not isinstance(self.values, tuple) or not self.values:
            raise ValueError(f"values: parameter {self.name!r} needs a non-empty tuple of values, got {self.values!r}")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"values: parameter {self.name!r} repeats a value: {self.values!r}")

    @property
    def numeric(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in self.values)


@dataclass(frozen=True)
class Space:
    """The knobs of one op (see the module docstring)."""

    op: str
    params: tuple[Param, ...]
    build: Callable[[Mapping[str, Any]], Callable[..., Any]]  # config -> fn with the op's registered signature
    shape_of: Callable[..., Shape]  # (*args, **kwargs) of a call -> its shape dict
    make_args: Callable[[Shape, Any], tuple[tuple, dict]]  # (shape, numpy Generator) -> (args, kwargs)
    default: Callable[[Shape], Config]  # the configuration an untuned backend=None call runs
    valid: Callable[[Mapping[str, Any], Shape], bool] | None = None
    backend: str = "cpp"  # the backend a tuned call reports (backends.resolve returns (backend, version, fn))
    reference: Callable[..., Any] | None = None  # (*args, **kwargs) -> expected; None: the op's numpy backend
    extra_features: Callable[[Mapping[str, Any], Shape], dict[str, float]] | None = None
    description: str = ""
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.params:
            raise ValueError(f"params: the space of {self.op!r} is empty (no parameter to tune)")
        names = tuple(p.name for p in self.params)
        if len(set(names)) != len(names):
            raise ValueError(f"params: the space of {self.op!r} names a parameter twice: {names}")
        object.__setattr__(self, "_names", names)

    # -- configurations -------------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(f"name: {self.op} has no parameter {name!r}; parameters: {list(self._names)}")

    def check(self, config: Mapping[str, Any]) -> Config:
        """``config`` as a dict, or ValueError naming the missing, unknown or out-of-range parameter."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config: expected a dict of {list(self._names)}, got {type(config).__name__}")
        unknown = sorted(set(config) - set(self._names))
        if unknown:
            raise ValueError(f"config: {self.op} has no parameter {unknown[0]!r}; parameters: {list(self._names)}")
        for p in self.params:
            if p.name not in config:
                raise ValueError(f"config: missing parameter {p.name!r} of {self.op}")
            if config[p.name] not in p.values:
                raise ValueError(f"config: {p.name}={config[p.name]!r} is not one of {list(p.values)} ({self.op})")
        return {n: config[n] for n in self._names}

    def is_valid(self, config: Mapping[str, Any], shape: Shape) -> bool:
        return self.valid is None or bool(self.valid(config, shape))

    def size(self) -> int:
        """Number of configurations before constraints (the product of the value counts)."""
        return math.prod(len(p.values) for p in self.params)

    def configs(self, shape: Shape | None = None) -> Iterator[Config]:
        """Every configuration (the grid), in a fixed order; with ``shape``, only the valid ones."""
        for combo in itertools.product(*(p.values for p in self.params)):
            cfg = dict(zip(self._names, combo))
            if shape is None or self.is_valid(cfg, shape):
                yield cfg

    def sample(self, rng: Any, shape: Shape | None = None, tries: int = 1000) -> Config:
        """A uniformly random configuration (valid for ``shape`` when given: rejection sampling)."""
        for _ in range(tries):
            cfg = {p.name: p.values[int(rng.integers(len(p.values)))] for p in self.params}
            if shape is None or self.is_valid(cfg, shape):
                return cfg
        raise ValueError(f"shape: no valid configuration of {self.op} found in {tries} random draws for {shape}")

    def neighbours(self, config: Mapping[str, Any], shape: Shape | None = None) -> list[Config]:
        """Configurations one step away: one parameter moved to an adjacent value (numeric) or any other value."""
        cfg = self.check(config)
        out = []
        for p in self.params:
            i = p.values.index(cfg[p.name])
            others = (
                [j for j in (i - 1, i + 1) if 0 <= j < len(p.values)]
                if p.numeric
                else [j for j in range(len(p.values)) if j != i]
            )
            for j in others:
                n = dict(cfg, **{p.name: p.values[j]})
                if shape is None or self.is_valid(n, shape):
                    out.append(n)
        return out

    # -- features for a cost model --------------------------------------------------------------------------
    def feature_names(self, shape: Shape) -> list[str]:
        names = [f"shape.{k}" for k in sorted(shape)]
        for p in self.params:
            names += [f"{p.name}"] if p.numeric else [f"{p.name}={v}" for v in p.values]
        if self.extra_features is not None:
            names += sorted(self.extra_features(next(self.configs()), shape))
        return names

    def features(self, config: Mapping[str, Any], shape: Shape) -> list[float]:
        """(config, shape) as numbers: log2 of every size and integer knob, one-hot categorical knobs, then the
        space's ``extra_features`` (sorted by name)."""
        cfg = self.check(config)
        out = [math.log2(max(int(shape[k]), 1)) for k in sorted(shape)]
        for p in self.params:
            v = cfg[p.name]
            if p.numeric:
                out.append(math.log2(v) if v > 0 else -1.0)
            else:
                out += [1.0 if v == c else 0.0 for c in p.values]
        if self.extra_features is not None:
            extra = self.extra_features(cfg, shape)
            out += [float(extra[k]) for k in sorted(extra)]
        return out


def class_of(shape: Mapping[str, int]) -> str:
    """The shape class of ``shape``: every size rounded up to a power of two, ``"K256_M128_N64"`` (sorted names)."""
    parts = []
    for k in sorted(shape):
        n = int(shape[k])
        parts.append(f"{k}{1 << max(n - 1, 0).bit_length() if n > 0 else 0}")
    return "_".join(parts)


# ------------------------------------------------------------------------------------------------------ registry
_SPACES: dict[str, Space] = {}


def declare(space: Space) -> Space:
    """Register ``space`` for its op; a second declaration replaces the first. The declaring module must be one
    of the topic table's registering modules (``Topic.registers``), so ``get`` finds it by name."""
    if not isinstance(space, Space):
        raise TypeError(f"space: expected a tunable.Space, got {type(space).__name__}")
    _SPACES[space.op] = space
    return space


def get(op: str) -> Space:
    """The search space of ``op`` (the topic table's registering modules are imported first)."""
    if not isinstance(op, str):
        raise TypeError(f"op: expected an op name (str), got {type(op).__name__}")
    if op not in _SPACES and "." in op:
        backends.load_registered(op.split(".", 1)[0])
    if op not in _SPACES:
        backends.load_registered()
        if op not in _SPACES:
            raise ValueError(f"op: no search space is declared for {op!r}; tunable ops: {ops()}")
    return _SPACES[op]


def ops() -> list[str]:
    """Every op with a declared search space."""
    backends.load_registered()
    return sorted(_SPACES)


# ------------------------------------------------------------------------------------------ tuned configurations
_CONFIG_PROVIDER: Callable[[Space, Shape], Config | None] | None = None


def set_config_provider(provider: Callable[[Space, Shape], Config | None] | None) -> Any:
    """Install (or with None remove) what ``tuned_config`` asks; returns the previous one. ``tinylearn.tune``'s
    dispatch installs its record lookup here beside ``backends.set_tuned_provider``, so code that builds kernels
    itself (the compiler's code generator) reads tuned configurations without importing ``tinylearn.tune``."""
    global _CONFIG_PROVIDER
    if provider is not None and not callable(provider):
        raise TypeError(f"provider: expected a callable or None, got {type(provider).__name__}")
    prev, _CONFIG_PROVIDER = _CONFIG_PROVIDER, provider
    return prev


def has_config_provider() -> bool:
    """Whether tuned configurations are being served (tuning mode not "off")."""
    return _CONFIG_PROVIDER is not None


def tuned_config(space: Space, shape: Shape) -> Config | None:
    """The tuned configuration of ``space`` for ``shape``'s class, or None (tuning off, no record, or a stored
    configuration that is not valid here)."""
    if _CONFIG_PROVIDER is None:
        return None
    return _CONFIG_PROVIDER(space, shape)
