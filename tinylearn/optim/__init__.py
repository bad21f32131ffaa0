"""``tinylearn.optim``: SGD (momentum, Nesterov, weight decay), Adam, AdamW and LR schedulers, matching torch."""

from . import lr_scheduler
from .adam import Adam, AdamW
from .lr_scheduler import CosineAnnealingLR, LRScheduler, StepLR
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler", "LRScheduler", "StepLR", "CosineAnnealingLR"]
