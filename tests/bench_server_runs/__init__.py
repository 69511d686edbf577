"""The pieces benchmarks that start `raypd serve` share (benchmarks/server_runs/)."""
