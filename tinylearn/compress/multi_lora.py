"""Many LoRA adapters on one frozen base: per-request selection, batched multi-adapter matmul, a shared cache [Q245].

Serving (Punica / S-LoRA): requests for different fine-tunes of one base model share the base GEMM; only the
rank-r deltas differ per row. For x [N, in] and adapter id a(n) per row:

    y[n] = x[n] W^T + b + s_a (x[n] A_a^T) B_a^T          (a(n) = -1 / None: base only)

    method="grouped"     sort rows by adapter, one (x_g A_a^T) B_a^T GEMM pair per group (Punica's SGMV idea):
                         cost  N r (in + out) MACs on top of the base GEMM, adapters of different ranks fine
    method="gather_bmm"  stack every adapter padded to r_max (scaling folded into B), gather A[a(n)], B[a(n)] per
                         row and run two batched matvecs (BGMV): one kernel, no sort, but reads r_max weights/row
    method="loop"        per-row reference;  ``merged_forward(x, name)``: x (W + s B A)^T + b, the merged weights

``MultiLoRALinear`` is the numpy, inference-only kernel study of one layer. The model-level path is in lora.py:
``apply_lora`` / ``apply_qlora`` then ``add_adapter(model, name, r, alpha)`` puts named adapters on every adapted
layer of one shared frozen base, and ``with use_adapters(model, ids):`` runs a forward where batch row n uses
adapter ids[n] (the grouped method above, in tinylearn autograd: training a mixed batch updates each adapter with
its own rows' gradients).

AdapterCache (what keeps GPU memory small when many adapters are similar, e.g. fine-tuned from one checkpoint):

1. differential encoding: an adapter near an already stored one is kept as (reference, sparse *replacement*
   entries: the positions where A or B differ and their new values). Replacement, not addition, so ``tol=0``
   reconstructs bit-exactly (x0 + (x - x0) is not always x in float); with ``tol > 0`` entries with
   |difference| <= tol are dropped and every entry of A and B is off by at most tol (the bound is asserted).
2. similarity index: SimHash of the effective update dW = s B A (what the adapter does, independent of the A/B
   factorisation): bit k = sign(<dW, u_k v_k^T>) = sign((u_k^T B)(A v_k)) with seeded Gaussian u_k, v_k, computed
   without materialising dW (O(bits r (in + out))). Near-duplicates have small Hamming distance; unrelated
   adapters sit near bits / 2.
3. dynamic loading: adapters live on disk (np.savez, one file each); a byte budget holds the resident ones in LRU
   order; a miss loads from disk (a delta entry also makes its reference resident) and evicts least recently used
   entries until the budget fits. ``stats()`` reports hits, misses, hit rate, loads, evictions and resident bytes.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..nn.layers import Linear

Adapter = tuple[np.ndarray, np.ndarray, float]  # (A [r, in], B [out, r], scaling)


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x.data if hasattr(x, "data") and not isinstance(x, np.ndarray) else x)


def _check_adapter(name: str, ad: Any, in_f: int, out_f: int) -> Adapter:
    if not isinstance(ad, tuple | list) or len(ad) != 3:
        raise TypeError(f"adapters[{name!r}]: expected (A, B, scaling), got {type(ad).__name__}")
    a, b, s = np.asarray(ad[0], np.float32), np.asarray(ad[1], np.float32), float(ad[2])
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != in_f or b.shape[0] != out_f or a.shape[0] != b.shape[1]:
        raise ValueError(f"adapters[{name!r}]: A {a.shape} / B {b.shape} do not fit [r, {in_f}] / [{out_f}, r]")
    return a, b, s


class MultiLoRALinear:
    """One frozen ``Linear`` and named adapters; ``forward(x, adapter_ids)`` applies adapter a(n) to row n."""

    def __init__(self, base: Linear, adapters: Mapping[str, Any]) -> None:
        if not isinstance(base, Linear):
            raise TypeError(f"base: expected a tinylearn.nn.Linear, got {type(base).__name__}")
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.adapters: dict[str, Adapter] = {}
        for k, v in adapters.items():
            self.add_adapter(k, v)

    def add_adapter(self, name: str, adapter: Any) -> None:
        self.adapters[name] = _check_adapter(name, adapter, self.in_features, self.out_features)
        self._stacked: tuple[np.ndarray, np.ndarray] | None = None

    def _ids(self, adapter_ids: Sequence[Any], n: int) -> np.ndarray:
        """Row -> adapter index (position in self.adapters), -1 for base-only rows."""
        if len(adapter_ids) != n:
            raise ValueError(f"adapter_ids: expected {n} entries (one per row of x), got {len(adapter_ids)}")
        names = list(self.adapters)
        out = np.empty(n, dtype=np.int64)
        for i, a in enumerate(adapter_ids):
            if a is None or (isinstance(a, int | np.integer) and a == -1):
                out[i] = -1
            elif a in self.adapters:
                out[i] = names.index(a)
            else:
                raise KeyError(f"adapter_ids[{i}]: unknown adapter {a!r}; known: {names}")
        return out

    def _x(self, x: Any) -> np.ndarray:
        x = np.asarray(_arr(x), np.float32)
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x: expected shape [N, {self.in_features}], got {x.shape}")
        return x

    def base_forward(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.base.weight.data.T
        return y + self.base.bias.data if self.base.bias is not None else y

    def forward(self, x: Any, adapter_ids: Sequence[Any], method: str = "grouped") -> np.ndarray:
        x = self._x(x)
        ids = self._ids(adapter_ids, x.shape[0])
        y = self.base_forward(x)
        ads = list(self.adapters.values())
        if method == "grouped":
            order = np.argsort(ids, kind="stable")
            bounds = np.flatnonzero(np.diff(ids[order])) + 1
            for grp in np.split(order, bounds):
                if grp.size == 0 or ids[grp[0]] < 0:
                    continue
                a, b, s = ads[ids[grp[0]]]
                y[grp] += ((x[grp] @ a.T) @ b.T) * np.float32(s)
        elif method == "gather_bmm":
            a_all, b_all = self._stack()
            sel = np.where(ids < 0, len(ads), ids)  # slot len(ads) is the zero adapter
            h = np.einsum("nri,ni->nr", a_all[sel], x)
            y += np.einsum("nor,nr->no", b_all[sel], h)
        elif method == "loop":
            for n, i in enumerate(ids):
                if i >= 0:
                    a, b, s = ads[i]
                    y[n] += ((x[n] @ a.T) @ b.T) * np.float32(s)
        else:
            raise ValueError(f"method: expected 'grouped', 'gather_bmm' or 'loop', got {method!r}")
        return y

    __call__ = forward

    def _stack(self) -> tuple[np.ndarray, np.ndarray]:
        if self._stacked is None:
            ads = list(self.adapters.values())
            r = max((a.shape[0] for a, _, _ in ads), default=1)
            a_all = np.zeros((len(ads) + 1, r, self.in_features), np.float32)
            b_all = np.zeros((len(ads) + 1, self.out_features, r), np.float32)
            for i, (a, b, s) in enumerate(ads):
                a_all[i, : a.shape[0]] = a
                b_all[i, :, : a.shape[0]] = b * np.float32(s)
            self._stacked = (a_all, b_all)
        return self._stacked

    def merged_weight(self, name: str) -> np.ndarray:
        if name not in self.adapters:
            raise KeyError(f"name: unknown adapter {name!r}; known: {list(self.adapters)}")
        a, b, s = self.adapters[name]
        return self.base.weight.data + np.float32(s) * (b @ a)

    def merged_forward(self, x: Any, name: str, weight: np.ndarray | None = None) -> np.ndarray:
        """x (W + s B A)^T + b: every row with adapter ``name`` (pass ``weight`` to reuse a merged matrix)."""
        w = self.merged_weight(name) if weight is None else weight
        y = self._x(x) @ w.T
        return y + self.base.bias.data if self.base.bias is not None else y


# ---- 1. differential encoding ------------------------------------------------------------------------------------


@dataclass
class DeltaAdapter:
    """An adapter stored as replacements over a reference: positions (flat) and values, for A and B."""

    reference: str
    a_idx: np.ndarray
    a_val: np.ndarray
    b_idx: np.ndarray
    b_val: np.ndarray
    scaling: float
    tol: float

    @property
    def nbytes(self) -> int:
        return int(self.a_idx.nbytes + self.a_val.nbytes + self.b_idx.nbytes + self.b_val.nbytes)


def encode_delta(reference: Adapter, adapter: Adapter, ref_name: str, tol: float = 0.0) -> DeltaAdapter:
    """Replacement entries where |adapter - reference| > tol (tol 0: every differing entry -> exact)."""
    if tol < 0:
        raise ValueError(f"tol: must be >= 0, got {tol}")
    (a0, b0, _), (a, b, s) = reference, adapter
    if a0.shape != a.shape or b0.shape != b.shape:
        raise ValueError(f"adapter: shapes A {a.shape} B {b.shape} differ from the reference's {a0.shape} {b0.shape}")
    ai = np.flatnonzero(np.abs(a - a0) > tol if tol > 0 else a != a0).astype(np.int32)
    bi = np.flatnonzero(np.abs(b - b0) > tol if tol > 0 else b != b0).astype(np.int32)
    return DeltaAdapter(ref_name, ai, a.ravel()[ai].copy(), bi, b.ravel()[bi].copy(), float(s), float(tol))


def decode_delta(reference: Adapter, d: DeltaAdapter) -> Adapter:
    a, b = reference[0].copy(), reference[1].copy()
    a.ravel()[d.a_idx] = d.a_val
    b.ravel()[d.b_idx] = d.b_val
    return a, b, d.scaling


# ---- 2. similarity hash --------------------------------------------------------------------------------------------


class SimHashIndex:
    """SimHash of dW = s B A with rank-one Gaussian projections; ``query`` returns (name, Hamming distance)."""

    def __init__(self, in_features: int, out_features: int, bits: int = 64, seed: int = 0) -> None:
        if bits < 1:
            raise ValueError(f"bits: must be >= 1, got {bits}")
        rng = np.random.default_rng(seed)
        self.u = rng.standard_normal((bits, out_features)).astype(np.float32)
        self.v = rng.standard_normal((bits, in_features)).astype(np.float32)
        self.codes: dict[str, np.ndarray] = {}

    def code(self, adapter: Adapter) -> np.ndarray:
        a, b, s = adapter
        if a.shape[1] != self.v.shape[1] or b.shape[0] != self.u.shape[1]:
            raise ValueError(
                f"adapter: A {a.shape} / B {b.shape} do not fit the index's {self.v.shape[1]} in, {self.u.shape[1]} out"
            )
        proj = np.einsum("kr,kr->k", self.u @ b, self.v @ a.T) * s  # <dW, u_k v_k^T>
        return proj > 0

    def add(self, name: str, adapter: Adapter) -> np.ndarray:
        self.codes[name] = self.code(adapter)
        return self.codes[name]

    def query(self, adapter: Adapter, max_distance: int | None = None) -> list[tuple[str, int]]:
        c = self.code(adapter)
        out = sorted(((n, int(np.count_nonzero(c != k))) for n, k in self.codes.items()), key=lambda t: t[1])
        return [t for t in out if max_distance is None or t[1] <= max_distance]


# ---- 3. dynamic loading --------------------------------------------------------------------------------------------


class AdapterCache:
    """Disk-backed adapters, an LRU of resident (encoded) entries within ``budget_bytes``, SimHash dedup on put."""

    def __init__(
        self,
        directory: str,
        budget_bytes: int,
        in_features: int,
        out_features: int,
        max_hamming: int = 4,
        tol: float = 0.0,
        bits: int = 64,
        seed: int = 0,
    ) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes: must be > 0, got {budget_bytes}")
        os.makedirs(directory, exist_ok=True)
        self.directory, self.budget_bytes = directory, int(budget_bytes)
        self.index = SimHashIndex(in_features, out_features, bits, seed)
        self.max_hamming, self.tol = max_hamming, tol
        self.kind: dict[str, str] = {}  # name -> "full" | "delta"
        self.resident: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.hits = self.misses = self.loads = self.evictions = 0
        self.disk_bytes: dict[str, int] = {}

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.npz")

    def put(self, name: str, adapter: Any) -> str:
        """Store on disk, delta-encoded against the nearest full adapter within ``max_hamming``; returns the kind."""
        if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"name: expected an alphanumeric adapter name, got {name!r}")
        a, b, s = _check_adapter(name, adapter, self.index.v.shape[1], self.index.u.shape[1])
        near = [n for n, _ in self.index.query((a, b, s), self.max_hamming) if n != name]
        if near:
            ref = self._load_full(near[0])
            d = encode_delta(ref, (a, b, s), near[0], self.tol)
            np.savez(
                self._path(name),
                kind="delta",
                ref=near[0],
                a_idx=d.a_idx,
                a_val=d.a_val,
                b_idx=d.b_idx,
                b_val=d.b_val,
                scaling=s,
                tol=self.tol,
                a_shape=a.shape,
                b_shape=b.shape,
            )
            self.kind[name], self.disk_bytes[name] = "delta", d.nbytes
        else:
            np.savez(self._path(name), kind="full", A=a, B=b, scaling=s)
            self.index.add(name, (a, b, s))
            self.kind[name], self.disk_bytes[name] = "full", a.nbytes + b.nbytes
        self.resident.pop(name, None)
        return self.kind[name]

    def _load_full(self, name: str) -> Adapter:
        with np.load(self._path(name)) as f:
            return f["A"], f["B"], float(f["scaling"])

    def _entry(self, name: str, pinned: set[str]) -> Any:
        if name in self.resident:
            self.resident.move_to_end(name)
            return self.resident[name][0]
        if name not in self.kind:
            raise KeyError(f"name: unknown adapter {name!r}")
        self.loads += 1
        if self.kind[name] == "full":
            entry: Any = self._load_full(name)
            nbytes = entry[0].nbytes + entry[1].nbytes
        else:
            with np.load(self._path(name)) as f:
                entry = DeltaAdapter(
                    str(f["ref"]), f["a_idx"], f["a_val"], f["b_idx"], f["b_val"], float(f["scaling"]), float(f["tol"])
                )
            nbytes = entry.nbytes
        self._make_room(nbytes, pinned | {name})
        self.resident[name] = (entry, nbytes)
        return entry

    def _make_room(self, nbytes: int, pinned: set[str]) -> None:
        if nbytes > self.budget_bytes:
            raise MemoryError(f"budget_bytes: {self.budget_bytes} cannot hold one entry of {nbytes} bytes")
        while self.bytes_resident + nbytes > self.budget_bytes:
            victim = next((n for n in self.resident if n not in pinned), None)
            if victim is None:
                raise MemoryError(f"budget_bytes: {self.budget_bytes} cannot hold the pinned entries {sorted(pinned)}")
            del self.resident[victim]
            self.evictions += 1

    def get(self, name: str) -> Adapter:
        """The decoded adapter (A, B, scaling); counts a hit when its entry (and reference) were resident."""
        hit = name in self.resident and (
            self.kind.get(name) == "full" or self.resident[name][0].reference in self.resident
        )
        self.hits += hit
        self.misses += not hit
        entry = self._entry(name, set())
        if isinstance(entry, DeltaAdapter):
            ref = self._entry(entry.reference, {name})
            self.resident.move_to_end(name)
            return decode_delta(ref, entry)
        return entry

    @property
    def bytes_resident(self) -> int:
        return sum(nb for _, nb in self.resident.values())

    def stats(self) -> dict[str, Any]:
        n = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hits / n if n else 0.0,
            "loads": self.loads,
            "evictions": self.evictions,
            "bytes_resident": self.bytes_resident,
            "disk_bytes": sum(self.disk_bytes.values()),
            "n_delta": sum(k == "delta" for k in self.kind.values()),
        }


def synthetic_trace(names: Sequence[str], n_requests: int, zipf_s: float = 1.1, seed: int = 0) -> list[str]:
    """A SYNTHETIC request trace: adapter popularity ~ Zipf(s) over ``names`` (seeded)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(names) + 1) ** zipf_s
    return [names[i] for i in rng.choice(len(names), size=n_requests, p=p / p.sum())]


def bench_multi_lora(
    n_rows: int = 64, n_adapters: int = 8, d: int = 256, r: int = 8, seed: int = 0, repeat: int = 20
) -> dict[str, Any]:
    """Median seconds per forward: grouped / gather_bmm / per-row loop / merged-weights-per-adapter / base only.

    merged: one pre-merged [d, d] weight per adapter (n_adapters x the base's memory), one GEMM per adapter group.
    """
    from ..autograd.factory import manual_seed
    from ..bench import measure

    manual_seed(seed)
    rng = np.random.default_rng(seed)
    ads = {
        f"a{i}": (
            rng.standard_normal((r, d)).astype(np.float32) * 0.05,
            rng.standard_normal((d, r)).astype(np.float32) * 0.05,
            2.0,
        )
        for i in range(n_adapters)
    }
    m = MultiLoRALinear(Linear(d, d), ads)
    x = rng.standard_normal((n_rows, d)).astype(np.float32)
    ids = [f"a{i}" for i in rng.integers(0, n_adapters, n_rows)]
    merged = {k: m.merged_weight(k) for k in ads}
    idx = np.asarray([int(a[1:]) for a in ids])
    groups = {k: np.flatnonzero(idx == i) for i, k in enumerate(ads)}

    def run_merged() -> np.ndarray:
        y = np.empty((n_rows, d), np.float32)
        for k, rows in groups.items():
            y[rows] = m.merged_forward(x[rows], k, weight=merged[k])
        return y

    ref = m.forward(x, ids, method="loop")
    out: dict[str, Any] = {"n_rows": n_rows, "n_adapters": n_adapters, "d": d, "r": r}
    fns = {
        "grouped": lambda: m.forward(x, ids, "grouped"),
        "gather_bmm": lambda: m.forward(x, ids, "gather_bmm"),
        "loop": lambda: m.forward(x, ids, "loop"),
        "merged_per_adapter": run_merged,
        "base_only": lambda: m.base_forward(x),
    }
    for k, fn in fns.items():
        if k != "base_only" and not np.allclose(fn(), ref, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"bench_multi_lora: {k} disagrees with the per-row loop")
        out[k + "_s"] = measure(fn, repeat=repeat).median
    out["weight_bytes_adapters"] = sum(a.nbytes + b.nbytes for a, b, _ in ads.values())
    out["weight_bytes_merged"] = sum(w.nbytes for w in merged.values())
    return out
