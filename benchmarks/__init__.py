"""raypd's benchmarks, each runnable as `raypd bench NAME`; map in docs/architecture.md, figures in docs/benchmarks.md."""
