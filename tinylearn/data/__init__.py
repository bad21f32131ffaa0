"""``tinylearn.data``: the sklearn digits dataset, a seeded train/test split and a seeded DataLoader."""

from .datasets import load_digits, train_test_split
from .loader import DataLoader

__all__ = ["load_digits", "train_test_split", "DataLoader"]
