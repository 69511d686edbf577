"""What the benchmarks that start `raypd serve` processes share: a run that SIGINT and SIGTERM end
with its clean-up, and a server stopped on every way out of its block; map in docs/architecture.md."""
