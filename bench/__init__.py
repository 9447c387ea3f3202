"""Benchmarks (engine: ``bench.engine_bench``)."""
