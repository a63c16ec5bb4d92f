"""Accuracy benchmark: perfcast's predictions against measured optimizations.

``python -m benchmarks.accuracy`` scores the recorded pairs (committed traces and unprofiled
measurements, GPU and CPU; no GPU needed); ``python -m benchmarks.accuracy live [--quick]``
measures new pairs on this machine (see ``runner.main``).
"""
