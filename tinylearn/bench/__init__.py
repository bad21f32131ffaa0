"""Benchmark harness: measure(), side-by-side Comparison tables (tinylearn vs torch vs tinygrad), plots,
machine roofline, and the topic registry behind ``tinylearn bench``.

Benchmarks live here and in notebooks, never as timed assertions in tests.
"""

from .comparators import Comparison, import_tinygrad, tinygrad_jit, tinygrad_status
from .plots import plot_table
from .registry import TOPICS, available_topics, run_topic
from .table import Row, Table
from .timing import Timing, measure

__all__ = [
    "Comparison",
    "Row",
    "Table",
    "Timing",
    "TOPICS",
    "available_topics",
    "import_tinygrad",
    "measure",
    "plot_table",
    "run_topic",
    "tinygrad_jit",
    "tinygrad_status",
]
