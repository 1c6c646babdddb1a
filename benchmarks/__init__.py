"""autotune's benchmarks, run from a source checkout (they are not part of the installed package).

- `python -m benchmarks`: the suite, autotune against ground truth on the planted-bottleneck
  examples (`benchmarks.suite`).
- `python -m benchmarks.overhead`: what the instrumented loop costs against a bare loop and
  against torch.profiler (`benchmarks.overhead`).

They use autotune's public API only and are not run by the default tests (only their
`--quick` smoke runs are).
"""
