"""Predicting the next training step's time from the history of batch features [Q123].

A training loop whose batch changes from step to step (dynamic batching, curriculum lengths, a loss scaler that
skips steps) has a step time that is mostly a function of the *next* batch's features plus a slowly drifting
machine state (caches, clocks, the other processes). Two predictors of ``y_t`` (seconds, or bytes) are fit on the
recorded history ``(y_1, x_1), ..., (y_{t-1}, x_{t-1})`` and the next batch's features ``x_t`` (known before the
step runs: the scheduler chose them):

``ARPredictor(order=p, exog=[...])``   ARX by least squares: ``y_t = c + sum_i a_i y_{t-i} + sum_j b_j x_{t,j}``,
                                       the autoregressive terms carry the drift, the exogenous ones the batch.
``LSTMPredictor(window, hidden)``      a one-layer LSTM written with tinylearn autograd (``LSTMCell``: the four
                                       gates from one matmul of ``[x, h]``, torch's gate order i, f, g, o) reading the
                                       last ``window`` steps of (normalised log y, features) and a linear head.
``LastValue``                          the baseline: ``y_t = y_{t-1}``.

``collect_step_times`` records real step times of a small tinylearn MLP trained with a batch size that varies;
``compare_predictors`` reports each predictor's mean and median absolute (relative) error on a held-out tail;
``pick_batch_size`` uses a predictor to choose the largest batch whose predicted time fits a budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._inputs import is_int
from .._threads import limited_threads
from ..autograd import Tensor, cat


def _as_matrix(features: Any, names: Sequence[str], n: int, arg: str) -> np.ndarray:
    """Features given as a list of dicts, a dict of columns or an array -> float64 [n, len(names)]."""
    if not names:
        return np.zeros((n, 0))
    if isinstance(features, Mapping):
        missing = [k for k in names if k not in features]
        if missing:
            raise ValueError(f"{arg}: missing feature column {missing[0]!r}; expected {list(names)}")
        x = np.stack([np.asarray(features[k], dtype=np.float64) for k in names], axis=1)
    elif isinstance(features, Sequence) and features and isinstance(features[0], Mapping):
        try:
            x = np.array([[float(r[k]) for k in names] for r in features], dtype=np.float64)
        except KeyError as e:
            raise ValueError(f"{arg}: a row lacks feature {e.args[0]!r}; expected {list(names)}") from None
    else:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
    if x.shape != (n, len(names)):
        raise ValueError(f"{arg}: expected {n} rows of {len(names)} features {list(names)}, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{arg}: features contain NaN or inf")
    return x


def _check_y(y: Any, min_len: int) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64).ravel()
    if y.size < min_len:
        raise ValueError(f"y: need at least {min_len} observations, got {y.size}")
    if not np.isfinite(y).all() or (y <= 0).any():
        raise ValueError("y: step times must be finite and positive")
    return y


class LastValue:
    """Baseline: the next step takes as long as the last one."""

    name = "last value"
    exog: tuple[str, ...] = ()

    def fit(self, y: Any, features: Any = None) -> LastValue:
        return self

    def predict_next(self, y_hist: Any, x_hist: Any, x_next: Any) -> float:
        return float(np.asarray(y_hist, dtype=np.float64).ravel()[-1])


def _names(exog: Sequence[str]) -> tuple[str, ...]:
    """The exogenous feature names as a tuple; a bare string (a common slip for a one-name list) is refused."""
    if isinstance(exog, str) or not all(isinstance(n, str) for n in exog):
        raise TypeError(f"exog: expected a sequence of feature names such as ('batch_size',), got {exog!r}")
    return tuple(exog)


class ARPredictor:
    """ARX(p) fit by least squares (see the module docstring). ``log=True`` models log y (multiplicative effects);
    ``robust=True`` refits once without the outliers (|residual| > 3 robust sigma: preempted steps on a shared
    machine), so a few 10x-slow steps do not bend the coefficients."""

    def __init__(
        self, order: int = 2, exog: Sequence[str] = ("batch_size",), log: bool = False, robust: bool = True
    ) -> None:
        if not is_int(order) or not 0 <= order <= 1 << 16:
            raise ValueError(f"order: expected an int in [0, 65536], got {order!r}")
        order = int(order)
        self.order, self.exog, self.log, self.robust = order, _names(exog), bool(log), bool(robust)
        self.name = f"ARX({order}) on {', '.join(self.exog) or 'nothing'}"
        self.coef: np.ndarray | None = None

    def _design(self, y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, z = self.order, (np.log(y) if self.log else y)
        rows = [np.concatenate(([1.0], z[t - p : t][::-1], x[t])) for t in range(p, len(y))]
        return np.array(rows), z[p:]

    def fit(self, y: Any, features: Any = None) -> ARPredictor:
        y = _check_y(y, self.order + 2)
        x = _as_matrix(features, self.exog, len(y), "features")
        a, b = self._design(y, x)
        self.coef = np.linalg.lstsq(a, b, rcond=None)[0]
        if self.robust:
            r = b - a @ self.coef
            dev = np.abs(r - np.median(r))
            keep = dev <= max(3 * 1.4826 * float(np.median(dev)), 1e-9 * float(np.abs(b).max()))
            if a.shape[1] < keep.sum() < len(b):
                self.coef = np.linalg.lstsq(a[keep], b[keep], rcond=None)[0]
        return self

    def predict_next(self, y_hist: Any, x_hist: Any, x_next: Any) -> float:
        if self.coef is None:
            raise ValueError("self: fit() the predictor before predict_next()")
        y = _check_y(y_hist, max(self.order, 1))
        xn = _as_matrix([x_next] if isinstance(x_next, Mapping) else [x_next], self.exog, 1, "x_next")[0]
        z = np.log(y) if self.log else y
        row = np.concatenate(([1.0], z[len(z) - self.order :][::-1], xn))
        out = float(row @ self.coef)
        return float(np.exp(out)) if self.log else out


class LSTMCell:
    """One LSTM step in tinylearn autograd: ``[i f g o] = [x, h] @ W + b`` (one matmul for the four gates),
    ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``. ``W`` is [input + hidden, 4 hidden]:
    torch's ``LSTMCell`` holds the same numbers as ``weight_ih``/``weight_hh`` [4 hidden, ·] (``from_torch``)."""

    def __init__(self, input_size: int, hidden_size: int, rng: np.random.Generator | None = None) -> None:
        for name, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        rng = rng if rng is not None else np.random.default_rng(0)
        k = 1.0 / np.sqrt(hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.W = Tensor(rng.uniform(-k, k, (input_size + hidden_size, 4 * hidden_size)), requires_grad=True)
        self.b = Tensor(rng.uniform(-k, k, (4 * hidden_size,)), requires_grad=True)

    @classmethod
    def from_torch(cls, cell: Any) -> LSTMCell:
        """The same weights as a ``torch.nn.LSTMCell`` (float64 copies)."""
        me = cls(cell.input_size, cell.hidden_size)
        w = np.concatenate([cell.weight_ih.detach().double().numpy(), cell.weight_hh.detach().double().numpy()], 1)
        me.W = Tensor(w.T.copy(), requires_grad=True)
        me.b = Tensor((cell.bias_ih + cell.bias_hh).detach().double().numpy(), requires_grad=True)
        return me

    def parameters(self) -> list[Tensor]:
        return [self.W, self.b]

    def __call__(self, x: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        h, c = state
        gates = cat([x, h], dim=1) @ self.W + self.b
        n = self.hidden_size
        i, f, g, o = (gates[:, k * n : (k + 1) * n] for k in range(4))
        c2 = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c2.tanh(), c2


class LSTMPredictor:
    """An LSTM over the last ``window`` steps of (normalised log y_{t-1}, features x_t) -> log y_t (Adam, full
    batch, ``epochs`` passes). Small on purpose: it has a few hundred observations to learn from."""

    def __init__(
        self, exog: Sequence[str] = ("batch_size",), window: int = 8, hidden: int = 8, epochs: int = 150,
        lr: float = 0.03, seed: int = 0,
    ) -> None:  # fmt: skip
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window: expected an int >= 1, got {window!r}")
        self.exog, self.window, self.hidden, self.epochs, self.lr = _names(exog), window, hidden, epochs, lr
        self.rng = np.random.default_rng(seed)
        self.name = f"LSTM(hidden {hidden}, window {window})"
        self.cell = LSTMCell(1 + len(self.exog), hidden, self.rng)
        k = 1.0 / np.sqrt(hidden)
        self.head_w = Tensor(self.rng.uniform(-k, k, (hidden, 1)), requires_grad=True)
        self.head_b = Tensor(np.zeros(1), requires_grad=True)
        self.stats: tuple[np.ndarray, np.ndarray] | None = None
        self.losses: list[float] = []

    def _inputs(self, z: np.ndarray, x: np.ndarray) -> np.ndarray:
        """[T, 1 + F] rows u_t = (z_{t-1}, x_t) normalised (t >= 1)."""
        mu, sd = self.stats  # type: ignore[misc]
        u = np.concatenate([z[:-1, None], x[1:]], axis=1)
        return (u - mu) / sd

    def _run(self, seqs: np.ndarray) -> Tensor:
        n = seqs.shape[0]
        h = Tensor(np.zeros((n, self.hidden)))
        c = Tensor(np.zeros((n, self.hidden)))
        for t in range(seqs.shape[1]):
            h, c = self.cell(Tensor(seqs[:, t, :]), (h, c))
        return h @ self.head_w + self.head_b

    def fit(self, y: Any, features: Any = None) -> LSTMPredictor:
        from ..optim import Adam

        y = _check_y(y, self.window + 3)
        x = _as_matrix(features, self.exog, len(y), "features")
        z = np.log(y)
        u_raw = np.concatenate([z[:-1, None], x[1:]], axis=1)
        self.stats = (u_raw.mean(0), u_raw.std(0) + 1e-9)
        self.zstat = (z.mean(), z.std() + 1e-9)
        u = self._inputs(z, x)
        w = self.window
        seqs = np.stack([u[t - w + 1 : t + 1] for t in range(w - 1, len(u))])  # u index t predicts z[t + 1]
        target = ((z[w:] - self.zstat[0]) / self.zstat[1])[:, None]
        params = [*self.cell.parameters(), self.head_w, self.head_b]
        opt = Adam(params, lr=self.lr)
        for _ in range(self.epochs):
            opt.zero_grad()
            loss = ((self._run(seqs) - Tensor(target)) ** 2).mean()
            loss.backward()
            opt.step()
            self.losses.append(float(loss.item()))
        return self

    def predict_next(self, y_hist: Any, x_hist: Any, x_next: Any) -> float:
        if self.stats is None:
            raise ValueError("self: fit() the predictor before predict_next()")
        y = _check_y(y_hist, self.window)
        xh = _as_matrix(x_hist, self.exog, len(y), "x_hist")
        xn = _as_matrix([x_next] if isinstance(x_next, Mapping) else [x_next], self.exog, 1, "x_next")
        z = np.concatenate([np.log(y), [0.0]])  # the last z is a placeholder: u_t reads z_{t-1}, x_t
        u = self._inputs(z, np.concatenate([xh, xn]))[-self.window :]
        out = float(self._run(u[None]).numpy().ravel()[0])
        return float(np.exp(out * self.zstat[1] + self.zstat[0]))


# ------------------------------------------------------------------------------------------------ measured data
def collect_step_times(
    steps: int = 200, batch_sizes: Sequence[int] = (16, 32, 64, 128, 256), width: int = 128, seed: int = 0,
    threads: int = 1,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """Real step times of a tinylearn MLP (in ``width`` -> ``width`` -> 10, SGD) trained ``steps`` steps with a
    batch size that random-walks over ``batch_sizes`` (stays with p 0.6, else moves to a neighbour or jumps).
    Returns (seconds [steps], {"batch_size": ..., "loss_scale": ...}); the loss scale is a dynamic loss scaler's
    value (halved on a gradient spike, doubled after 20 clean steps): a feature that does not change the time.
    BLAS / OpenMP run ``threads`` threads (1: idle BLAS threads spinning on a busy machine make steps 10x slower)."""
    with limited_threads(threads, name="threads"):
        return _collect(steps, batch_sizes, width, seed)


def _collect(steps: int, batch_sizes: Sequence[int], width: int, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    from ..nn import Linear, ReLU, Sequential
    from ..nn.functional import cross_entropy
    from ..optim import SGD

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 4:
        raise ValueError(f"steps: expected an int >= 4, got {steps!r}")
    if not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise ValueError(f"batch_sizes: expected positive ints, got {batch_sizes!r}")
    rng = np.random.default_rng(seed)
    model = Sequential(Linear(width, width), ReLU(), Linear(width, 10))
    opt = SGD(model.parameters(), lr=0.01)
    bs_i, scale, clean = len(batch_sizes) // 2, 2.0**12, 0
    times, bss, scales = [], [], []
    for _ in range(steps):
        r = rng.random()
        if r > 0.9:  # jump anywhere
            bs_i = int(rng.integers(len(batch_sizes)))
        elif r > 0.6:  # step to a neighbour
            bs_i = int(np.clip(bs_i + rng.choice((-1, 1)), 0, len(batch_sizes) - 1))
        b = batch_sizes[bs_i]
        xb = Tensor(rng.standard_normal((b, width)).astype(np.float32))
        yb = Tensor(rng.integers(0, 10, b))
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        bss.append(b)
        scales.append(scale)
        clean += 1
        if rng.random() < 0.03:
            scale, clean = scale / 2, 0
        elif clean >= 20:
            scale, clean = scale * 2, 0
    return np.array(times), {"batch_size": np.array(bss, dtype=np.float64), "loss_scale": np.array(scales)}


def compare_predictors(
    predictors: Sequence[Any], y: Any, features: Mapping[str, Any], train_fraction: float = 0.6
) -> list[dict[str, Any]]:
    """Fit each predictor on the first ``train_fraction`` of the series and predict every later step one ahead
    (from the true history): rows {"predictor", "mae_s", "mape", "mdape", "n"} (mape: mean |error| / y; mdape: its
    median, robust to the preempted steps a shared machine produces)."""
    y = _check_y(y, 8)
    if not 0.1 <= train_fraction <= 0.9:
        raise ValueError(f"train_fraction: expected a value in [0.1, 0.9], got {train_fraction!r}")
    cut = int(len(y) * train_fraction)
    rows = []
    for p in predictors:
        names = p.exog
        x = _as_matrix(features, names, len(y), "features")
        p.fit(y[:cut], {k: x[:cut, i] for i, k in enumerate(names)})
        start = max(cut, getattr(p, "window", 1), getattr(p, "order", 1))
        pred = np.array([p.predict_next(y[:t], x[:t], x[t]) for t in range(start, len(y))])
        err = np.abs(pred - y[start:])
        rows.append({"predictor": p.name, "mae_s": float(err.mean()), "mape": float((err / y[start:]).mean()),
                     "mdape": float(np.median(err / y[start:])),
                     "n": int(err.size)})  # fmt: skip
    return rows


def pick_batch_size(
    predictor: Any, y_hist: Any, x_hist: Mapping[str, Any], candidates: Sequence[int], budget_s: float,
    fixed: Mapping[str, float] | None = None,
) -> int | None:  # fmt: skip
    """The largest candidate batch size whose predicted next-step time is <= ``budget_s`` (None: none fits).
    ``fixed`` gives the other features of the next step (e.g. the current loss scale)."""
    if not isinstance(budget_s, int | float) or not budget_s > 0:
        raise ValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    if not candidates:
        raise ValueError("candidates: expected at least one batch size")
    y = np.asarray(y_hist, dtype=np.float64)
    xh = _as_matrix(x_hist, predictor.exog, len(y), "x_hist")
    best = None
    for b in sorted(candidates):
        row = {**(fixed or {}), "batch_size": b}
        missing = [k for k in predictor.exog if k not in row]
        if missing:
            raise ValueError(f"fixed: give the next step's {missing[0]!r}")
        if predictor.predict_next(y, xh, [row[k] for k in predictor.exog]) <= budget_s:
            best = b
    return best
