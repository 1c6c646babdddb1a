"""Benchmarks: autotune measured against ground truth and against bare loops (not run by default tests)."""
