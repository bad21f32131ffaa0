"""The polyhedral view of a loop nest: domains, affine accesses, dependence distances, legal unimodular transforms.

A perfect loop nest with loops x = (x_1..x_d) runs one statement S at every integer point of its *iteration domain*
{x : A x + b >= 0} (here rectangular: lo_i <= x_i <= hi_i, one pair of rows per loop), in lexicographic order.
Each array reference is an *affine access* x -> F x + f. Two instances s before t *depend* when they touch the same
element and one writes it (flow: write then read; anti: read then write; output: write then write); the
*distance* is d = t - s, lexicographically positive (its first non-zero entry is > 0) because s runs first.

A schedule change given by a unimodular matrix T (integer, det = +-1, so x -> T x maps the integer points one to
one) runs the points in lexicographic order of T x: permutation matrices interchange loops, -1 on the diagonal
reverses one, identity plus a factor below the diagonal skews (x_j' = x_j + f x_i). Then

    legal        iff T d is lexicographically positive for every distance d (each source still runs first)
    tilable      a band of loops may be tiled (strip-mined and the tile loops moved out) iff it is *fully
                 permutable*: every entry of every T d in the band is >= 0
    parallel     loop level l may run in parallel iff no T d is *carried* at l (has its first non-zero entry at l)

The examples: a direct conv2d, out[n,k,oh,ow] += in[n,c,oh+r,ow+s] * w[k,c,r,s]: the only dependences are the
reduction's on ``out`` (same n, k, oh, ow; carried by c, r, s), so any interchange keeping c, r, s in their relative
order is legal; treating += as associative (what every conv library does, changing float rounding) frees all orders.
The recurrence A[i][j] = A[i-1][j] + A[i][j-1] has distances (1,0), (0,1): interchange and tiling are legal as it
stands (both >= 0) but no loop is parallel; skewing j' = i + j and interchanging gives the wavefront, an outer loop
carrying everything and a parallel inner loop. The stencil A[i][j] = A[i-1][j+1] + A[i][j-1] has (1,-1), (0,1):
interchange is illegal and tiling needs the skew [[1,0],[1,1]] first, which makes the distances (1,0), (0,1).
Matmul C[i,j] += A[i,p] * B[p,j] has distances (0,0,+) only: a fully permutable band, so every loop order and
every tiling of (i, j, p) is legal, and i, j are parallel (what an affine tiling pass checks before tiling).

Dependences here are computed by exact enumeration of a small domain (and, for uniform accesses with a full-rank F,
by solving F d = f_src - f_dst, the same answer); ``execute`` runs the statement in a transformed order so a legal
transform reproduces the original result and an illegal one on the recurrence/stencil does not.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .._inputs import is_int

Matrix = Sequence[Sequence[int]]


@dataclass(frozen=True)
class Affine:
    coeffs: tuple[int, ...]  # one per loop
    const: int = 0

    def at(self, point: Sequence[int]) -> int:
        return sum(c * p for c, p in zip(self.coeffs, point)) + self.const

    def show(self, names: Sequence[str]) -> str:
        terms = [f"{'' if c == 1 else '-' if c == -1 else f'{c}*'}{n}" for c, n in zip(self.coeffs, names) if c]
        text = " + ".join(terms).replace("+ -", "- ")
        if self.const or not terms:
            text += f" {'+' if self.const >= 0 else '-'} {abs(self.const)}" if terms else str(self.const)
        return text


def parse_affine(text: str, loops: Sequence[str]) -> Affine:
    """'oh+r', 'i - 1', '2*i + j - 3' over the loop names."""
    src = text.replace(" ", "")
    if not src or not re.fullmatch(r"[+-]?(\d+\*?)?\w+([+-](\d+\*?)?\w+)*", src):
        raise ValueError(f"text: expected an affine expression of {list(loops)}, got {text!r}")
    coeffs, const = [0] * len(loops), 0
    for sign, num, name in re.findall(r"([+-]?)(\d+\*?)?([A-Za-z_]\w*|\d+)", src):
        k = -1 if sign == "-" else 1
        if name.isdigit():
            const += k * int(name)
        elif name in loops:
            coeffs[loops.index(name)] += k * (int(num.rstrip("*")) if num else 1)
        else:
            raise ValueError(f"text: {name!r} in {text!r} is not a loop of {list(loops)}")
    return Affine(tuple(coeffs), const)


@dataclass(frozen=True)
class Access:
    array: str
    index: tuple[Affine, ...]

    def at(self, point: Sequence[int]) -> tuple[int, ...]:
        return tuple(e.at(point) for e in self.index)

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(F, f) with element = F x + f."""
        return np.array([e.coeffs for e in self.index], dtype=np.int64), np.array([e.const for e in self.index])

    def show(self, names: Sequence[str]) -> str:
        return f"{self.array}[{', '.join(e.show(names) for e in self.index)}]"


@dataclass(frozen=True)
class LoopNest:
    loops: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]  # inclusive (lo, hi) per loop
    write: Access
    reads: tuple[Access, ...]
    op: str  # "fma": write = reads[0] + reads[1] * reads[2] ("+="); "sum": write = sum of reads

    def points(self) -> list[tuple[int, ...]]:
        """The iteration domain in the original (lexicographic) order."""
        return list(itertools.product(*(range(lo, hi + 1) for lo, hi in self.bounds)))

    def statement(self) -> str:
        if self.op == "fma":
            return f"{self.write.show(self.loops)} += {' * '.join(a.show(self.loops) for a in self.reads[1:])}"
        return f"{self.write.show(self.loops)} = {' + '.join(a.show(self.loops) for a in self.reads)}"


def loop_nest(loops: Sequence[tuple[str, int, int]], statement: str) -> LoopNest:
    """``loops``: (name, lo, hi) outermost first, bounds inclusive; ``statement``: 'X[..] += A[..] * B[..]' or
    'X[..] = A[..] + B[..] + ...' with affine subscripts."""
    names = tuple(n for n, _, _ in loops)
    bounds = []
    for name, lo, hi in loops:
        if not all(isinstance(v, int) for v in (lo, hi)) or lo > hi:
            raise ValueError(f"loops: {name!r} needs integer bounds lo <= hi, got ({lo!r}, {hi!r})")
        bounds.append((lo, hi))
    if len(set(names)) != len(names):
        raise ValueError(f"loops: names must be distinct, got {names}")

    def access(text: str) -> Access:
        m = re.fullmatch(r"\s*(\w+)\s*\[(.*)\]\s*", text)
        if not m:
            raise ValueError(f"statement: {text.strip()!r} is not an array access X[...] in {statement!r}")
        parts = re.split(r"\]\s*\[|,", m.group(2))
        return Access(m.group(1), tuple(parse_affine(p, names) for p in parts))

    if "+=" in statement:
        lhs, rhs = statement.split("+=")
        factors = rhs.split("*")
        if len(factors) != 2:
            raise ValueError(f"statement: '+=' needs 'A[..] * B[..]' on the right, got {statement!r}")
        w = access(lhs)
        return LoopNest(names, tuple(bounds), w, (w, *map(access, factors)), "fma")
    if "=" in statement:
        lhs, rhs = statement.split("=")
        return LoopNest(
            names, tuple(bounds), access(lhs), tuple(access(t) for t in re.split(r"\+(?![^\[]*\])", rhs)), "sum"
        )
    raise ValueError(f"statement: expected 'X[..] += A[..] * B[..]' or 'X[..] = A[..] + ...', got {statement!r}")


def constraints(nest: LoopNest, transform: Matrix | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(A, b, text) of the domain {x : A x + b >= 0}; with ``transform`` T, of the new variables y = T x."""
    d = len(nest.loops)
    A = np.zeros((2 * d, d), dtype=np.int64)
    b = np.zeros(2 * d, dtype=np.int64)
    for i, (lo, hi) in enumerate(nest.bounds):
        A[2 * i, i], b[2 * i], A[2 * i + 1, i], b[2 * i + 1] = 1, -lo, -1, hi
    names: Sequence[str] = nest.loops
    if transform is not None:
        T = check_unimodular(transform, d)
        A = A @ np.rint(np.linalg.inv(T)).astype(np.int64)  # x = T^-1 y, and T^-1 is an integer matrix
        names = [f"{n}'" for n in nest.loops]
    text = [f"{Affine(tuple(int(v) for v in row), int(c)).show(names)} >= 0" for row, c in zip(A, b)]
    return A, b, text


@dataclass(frozen=True)
class Dependence:
    kind: str  # "flow" (write -> read), "anti" (read -> write), "output" (write -> write)
    array: str
    distance: tuple[int, ...]

    def direction(self) -> tuple[str, ...]:
        return tuple("<" if v > 0 else ">" if v < 0 else "=" for v in self.distance)


def dependences(nest: LoopNest, relax_reductions: bool = False, max_points: int = 50_000) -> list[Dependence]:
    """Every distinct (kind, array, distance) between two different iterations, by enumerating the domain.

    ``relax_reductions``: drop the dependences of a '+=' on its own accumulator (treat it as associative)."""
    pts = nest.points()
    if len(pts) > max_points:
        raise ValueError(f"nest: {len(pts)} iterations, more than max_points={max_points}; use smaller bounds")
    events: dict[tuple, list[tuple[int, str]]] = {}
    for n, p in enumerate(pts):
        for a in nest.reads:
            events.setdefault((a.array, a.at(p)), []).append((n, "r"))
        events.setdefault((nest.write.array, nest.write.at(p)), []).append((n, "w"))
    kinds = {("w", "r"): "flow", ("r", "w"): "anti", ("w", "w"): "output"}
    found = set()
    for (array, _), ev in events.items():
        if relax_reductions and nest.op == "fma" and array == nest.write.array:
            continue
        for (s, ks), (t, kt) in itertools.combinations(ev, 2):
            if s != t and (ks, kt) in kinds:
                found.add(Dependence(kinds[ks, kt], array, tuple(np.subtract(pts[t], pts[s]).tolist())))
    return sorted(found, key=lambda d: (d.array, d.kind, d.distance))


def uniform_distance(source: Access, target: Access) -> tuple[int, ...] | None:
    """The distance t - s with source(s) = target(t) for uniform accesses (same full-column-rank F): the solution
    of F d = f_source - f_target; None when F differs, is rank-deficient (the distance is not unique), or d is not
    integer."""
    (Fs, fs), (Ft, ft) = source.matrix(), target.matrix()
    if Fs.shape != Ft.shape or not np.array_equal(Fs, Ft) or np.linalg.matrix_rank(Fs) < Fs.shape[1]:
        return None
    d, *_ = np.linalg.lstsq(Fs.astype(float), (fs - ft).astype(float), rcond=None)
    r = np.rint(d).astype(np.int64)
    return tuple(r.tolist()) if np.array_equal(Fs @ r, fs - ft) else None


def check_unimodular(transform: Matrix, d: int) -> np.ndarray:
    T = np.asarray(transform)
    if T.shape != (d, d) or not np.issubdtype(T.dtype, np.integer):
        raise ValueError(f"transform: expected a {d}x{d} integer matrix, got {np.asarray(transform).tolist()}")
    det = Fraction(round(np.linalg.det(T))) if d else Fraction(1)
    if abs(det) != 1:
        raise ValueError(f"transform: not unimodular (det = {det}), got {T.tolist()}")
    return T.astype(np.int64)


def lex_positive(v: Sequence[int]) -> bool:
    for x in v:
        if x:
            return x > 0
    return False


def _distances(deps: Sequence[Dependence], transform: Matrix | None) -> list[tuple[int, ...]]:
    if not deps:
        return []
    d = len(deps[0].distance)
    T = np.eye(d, dtype=np.int64) if transform is None else check_unimodular(transform, d)
    return [tuple((T @ np.array(dep.distance)).tolist()) for dep in deps]


def violations(deps: Sequence[Dependence], transform: Matrix) -> list[Dependence]:
    """The dependences whose transformed distance T d is not lexicographically positive."""
    return [dep for dep, td in zip(deps, _distances(deps, transform)) if not lex_positive(td)]


def is_legal(deps: Sequence[Dependence], transform: Matrix) -> bool:
    return not violations(deps, transform)


def fully_permutable(deps: Sequence[Dependence], transform: Matrix | None = None, band: slice = slice(None)) -> bool:
    """Every transformed distance has all entries >= 0 in ``band``: the band's loops may be permuted and tiled."""
    return all(min(td[band], default=0) >= 0 for td in _distances(deps, transform))


def parallel_loops(deps: Sequence[Dependence], transform: Matrix | None = None) -> list[bool]:
    """Per loop level: True when no transformed distance is carried there (first non-zero entry at that level)."""
    dists = _distances(deps, transform)
    d = len(deps[0].distance) if deps else 0
    carried = {next(i for i, v in enumerate(td) if v) for td in dists}
    return [i not in carried for i in range(d)]


def permutation(loops: Sequence[str], order: Sequence[str]) -> np.ndarray:
    """The interchange running ``loops`` in ``order`` (outermost first): y = P x."""
    if sorted(order) != sorted(loops):
        raise ValueError(f"order: expected a permutation of {list(loops)}, got {list(order)}")
    return np.array([[int(order[r] == loops[c]) for c in range(len(loops))] for r in range(len(loops))])


def reversal(d: int, level: int) -> np.ndarray:
    """x_level' = -x_level."""
    if not 0 <= level < d:
        raise ValueError(f"level: expected 0 <= level < d={d}, got {level}")
    T = np.eye(d, dtype=np.int64)
    T[level, level] = -1
    return T


def skew(d: int, target: int, source: int, factor: int = 1) -> np.ndarray:
    """x_target' = x_target + factor * x_source (source != target)."""
    if target == source or not (0 <= target < d and 0 <= source < d):
        raise ValueError(f"source, target: expected two different levels in [0, {d}), got {source}, {target}")
    T = np.eye(d, dtype=np.int64)
    T[target, source] = factor
    return T


def execution_order(nest: LoopNest, transform: Matrix | None = None, tile: int | None = None) -> list[tuple]:
    """The domain's points in lexicographic order of y = T x; with ``tile`` B, of (floor(y / B), y): the tiled
    loop nest (tile loops outside, point loops inside) over the transformed space."""
    pts = nest.points()
    T = np.eye(len(nest.loops), dtype=np.int64) if transform is None else check_unimodular(transform, len(nest.loops))
    if tile is not None and (not is_int(tile) or tile < 1):
        raise ValueError(f"tile: expected a positive int, got {tile!r}")
    tile = None if tile is None else int(tile)

    def key(p: tuple[int, ...]) -> tuple[int, ...]:
        y = tuple((T @ np.array(p)).tolist())
        return tuple(v // tile for v in y) + y if tile else y

    return sorted(pts, key=key)


def execute(
    nest: LoopNest, arrays: dict[str, np.ndarray], transform: Matrix | None = None, tile: int | None = None
) -> dict[str, np.ndarray]:
    """Run the statement at every point in the transformed order, on copies of ``arrays``."""
    out = {k: np.array(v, copy=True) for k, v in arrays.items()}
    missing = {a.array for a in (nest.write, *nest.reads)} - set(out)
    if missing:
        raise ValueError(f"arrays: missing {sorted(missing)}")
    for p in execution_order(nest, transform, tile):
        vals = [out[a.array][a.at(p)] for a in nest.reads]
        value = vals[0] + vals[1] * vals[2] if nest.op == "fma" else sum(vals[1:], vals[0])
        out[nest.write.array][nest.write.at(p)] = value
    return out


def conv2d_nest(n: int = 1, k: int = 2, c: int = 2, h: int = 4, w: int = 4, r: int = 2, s: int = 2) -> LoopNest:
    """Direct conv2d (stride 1, no padding): loops n, k, c, oh, ow, r, s."""
    if min(n, k, c, r, s) < 1 or h < r or w < s:
        raise ValueError(f"sizes: expected positive sizes with h >= r, w >= s, got {(n, k, c, h, w, r, s)}")
    loops = [("n", 0, n - 1), ("k", 0, k - 1), ("c", 0, c - 1), ("oh", 0, h - r), ("ow", 0, w - s)]
    loops += [("r", 0, r - 1), ("s", 0, s - 1)]
    return loop_nest(loops, "out[n, k, oh, ow] += inp[n, c, oh + r, ow + s] * wt[k, c, r, s]")


def matmul_nest(m: int = 4, n: int = 4, k: int = 4) -> LoopNest:
    """C[i, j] += A[i, p] * B[p, j]: distances (0, 0, +): a fully permutable band, every order and tiling legal."""
    return loop_nest([("i", 0, m - 1), ("j", 0, n - 1), ("p", 0, k - 1)], "C[i, j] += A[i, p] * B[p, j]")


def recurrence_nest(n: int = 6, m: int = 6) -> LoopNest:
    """A[i][j] = A[i-1][j] + A[i][j-1] over 1 <= i < n, 1 <= j < m: distances (1,0), (0,1)."""
    return loop_nest([("i", 1, n - 1), ("j", 1, m - 1)], "A[i][j] = A[i-1][j] + A[i][j-1]")


def stencil_nest(n: int = 6, m: int = 7) -> LoopNest:
    """A[i][j] = A[i-1][j+1] + A[i][j-1] over 1 <= i < n, 1 <= j < m - 1: distances (1,-1), (0,1)."""
    return loop_nest([("i", 1, n - 1), ("j", 1, m - 2)], "A[i][j] = A[i-1][j+1] + A[i][j-1]")


def describe(nest: LoopNest, transform: Matrix | None = None) -> str:
    """The statement, its domain as bounds and as A x + b >= 0, its access maps F x + f, and its dependences."""
    bounds = ",  ".join(f"{lo} <= {x} <= {hi}" for x, (lo, hi) in zip(nest.loops, nest.bounds))
    lines = [f"S: {nest.statement()}", f"domain:  {bounds}"]
    lines.append("as A x + b >= 0:  " + ",  ".join(constraints(nest)[2]))
    for a in (nest.write, *nest.reads[nest.op == "fma" :]):
        F, f = a.matrix()
        lines.append(f"access {a.show(nest.loops)}:  F = {F.tolist()}, f = {f.tolist()}")
    deps = dependences(nest)
    lines.append(f"dependences ({len(deps)}): " + ", ".join(f"{d.kind} {d.array} {d.distance}" for d in deps[:12]))
    if transform is not None:
        verdict = f"legal {is_legal(deps, transform)}, fully permutable {fully_permutable(deps, transform)}"
        lines.append(f"T = {np.asarray(transform).tolist()}: {verdict}, parallel {parallel_loops(deps, transform)}")
        lines.append("new domain:  " + ",  ".join(constraints(nest, transform)[2]))
    return "\n".join(lines)
