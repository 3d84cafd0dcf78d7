"""Benchmark suite comparing shoal with Dask distributed (see benchmarks/README.md)."""
