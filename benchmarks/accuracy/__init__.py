"""Accuracy benchmark: real optimizations on real workloads vs. perfcast's predictions.

Run with ``python -m benchmarks.accuracy [--quick]``; see ``runner.main`` for the options.
"""

from benchmarks.accuracy.runner import PREDICT_SPECS, main, run

__all__ = ["PREDICT_SPECS", "main", "run"]
