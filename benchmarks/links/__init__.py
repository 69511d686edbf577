"""`raypd bench links`: KV transfer bandwidth and latency between every pair of Ray nodes, measured
through kvtransfer's real path, and the topology file `raypd serve --topology` reads, built from it.
Map in docs/architecture.md."""
