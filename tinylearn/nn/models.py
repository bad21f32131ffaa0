"""Small reference models for the 8x8 digits data, shared by the quant / prune / memory / dist topics.

DigitsMLP:  [N,1,8,8] -> Flatten -> 64 -> hidden... (ReLU) -> 10
DigitsCNN:  [N,1,8,8] -> Conv3x3(1->c1,pad 1)-BN-ReLU -> MaxPool2 -> Conv3x3(c1->c2,pad 1)-BN-ReLU -> MaxPool2
            -> Flatten (c2*2*2) -> Linear(->10)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..autograd.tensor import Tensor
from .layers import BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from .module import Module


class DigitsMLP(Module):
    def __init__(self, hidden: int | Sequence[int] = 128, n_in: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        sizes = [hidden] if isinstance(hidden, int) else list(hidden)
        layers: list[Module] = [Flatten()]
        prev = n_in
        for h in sizes:
            layers += [Linear(prev, h), ReLU()]
            prev = h
        layers.append(Linear(prev, n_classes))
        self.net = Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class DigitsCNN(Module):
    def __init__(self, c1: int = 16, c2: int = 32, n_classes: int = 10, batch_norm: bool = True) -> None:
        super().__init__()
        feats: list[Module] = [Conv2d(1, c1, 3, padding=1)]
        if batch_norm:
            feats.append(BatchNorm2d(c1))
        feats += [ReLU(), MaxPool2d(2), Conv2d(c1, c2, 3, padding=1)]
        if batch_norm:
            feats.append(BatchNorm2d(c2))
        feats += [ReLU(), MaxPool2d(2)]
        self.features = Sequential(*feats)
        self.flatten = Flatten()
        self.fc = Linear(c2 * 2 * 2, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.flatten(self.features(x)))
