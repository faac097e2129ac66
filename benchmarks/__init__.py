"""`make bench`: the measurements behind docs/benchmarks.md. Speed is judged here, never in tests."""
