"""The models and data of ``tinylearn bench compress`` (bench.py): sklearn digits as vectors and as images, a
pretrained torch MLP and digits CNN with their tinylearn twins holding the same weights, and a seeded bigram token
corpus for the TinyGPT rows."""

from __future__ import annotations

from typing import Any

import numpy as np


def digits(n_train: int = 1300) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn digits flattened to [N, 64] float32, a fixed permutation split (train, test)."""
    from ..data import load_digits

    X, y = load_digits()
    X = X.reshape(len(X), -1).astype(np.float32)
    idx = np.random.default_rng(0).permutation(len(X))
    X, y = X[idx], y[idx]
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def torch_mlp(hidden: int, seed: int = 0, pretrain_steps: int = 30) -> Any:
    """torch MLP 64 -> hidden -> hidden -> 10, seeded, pretrained ``pretrain_steps`` SGD steps on digits."""
    import torch

    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                             torch.nn.ReLU(), torch.nn.Linear(hidden, 10))  # fmt: skip
    X, y, _, _ = digits()
    return _pretrain(tm, X, y, pretrain_steps, 0.05)


def tl_mlp(tm: Any) -> Any:
    """The tinylearn twin of ``torch_mlp`` holding the same weights."""
    from .. import nn

    h = tm[0].out_features
    m = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    m.load_state_dict({k: v.detach().numpy().copy() for k, v in tm.state_dict().items()})
    return m


CNN_TARGETS = ["fc"]


def torch_cnn(seed: int = 0, pretrain_steps: int = 60, lr: float = 0.1) -> Any:
    """torch twin of ``tl.nn.models.DigitsCNN(c1=16, c2=32, batch_norm=False)`` (same parameter names), seeded and
    pretrained ``pretrain_steps`` SGD steps (batch 64, ``lr``) on the digits train split (about 65% test accuracy:
    room for the fine-tuning runs to show a difference)."""
    import torch

    class TorchDigitsCNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                                torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1),
                                                torch.nn.ReLU(), torch.nn.MaxPool2d(2))  # fmt: skip
            self.flatten = torch.nn.Flatten()
            self.fc = torch.nn.Linear(32 * 2 * 2, 10)

        def forward(self, x: Any) -> Any:
            return self.fc(self.flatten(self.features(x)))

    torch.manual_seed(seed)
    tm = TorchDigitsCNN()
    X, y, _, _ = digits_images()
    return _pretrain(tm, X, y, pretrain_steps, lr)


def tl_cnn(tm: Any) -> Any:
    """The tinylearn ``DigitsCNN`` holding ``torch_cnn``'s weights."""
    from ..nn.models import DigitsCNN

    m = DigitsCNN(16, 32, batch_norm=False)
    m.load_state_dict({k: v.detach().numpy().copy() for k, v in tm.state_dict().items()})
    return m


def digits_images() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``digits()`` as [N, 1, 8, 8] images (the same split)."""
    X, y, Xte, yte = digits()
    return X.reshape(-1, 1, 8, 8), y, Xte.reshape(-1, 1, 8, 8), yte


def token_data(vocab: int, n_seq: int, seq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, next tokens) [n_seq, seq] int64 from a seeded random bigram chain (each token has 4 likely
    successors): something a language model can learn in a few steps."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, (vocab, 4))
    toks = np.empty((n_seq, seq + 1), np.int64)
    toks[:, 0] = rng.integers(0, vocab, n_seq)
    for t in range(seq):
        toks[:, t + 1] = succ[toks[:, t], rng.integers(0, 4, n_seq)]
    return toks[:, :-1].copy(), toks[:, 1:].copy()


def _pretrain(tm: Any, X: np.ndarray, y: np.ndarray, steps: int, lr: float) -> Any:
    """``steps`` SGD steps (batch 64, cycling through the first 1216 rows) of cross-entropy on (X, y); returns tm."""
    import torch

    opt = torch.optim.SGD(tm.parameters(), lr=lr)
    for i in range(steps):
        b = slice((i * 64) % 1216, (i * 64) % 1216 + 64)
        loss = torch.nn.functional.cross_entropy(tm(torch.from_numpy(X[b])), torch.from_numpy(y[b]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return tm
