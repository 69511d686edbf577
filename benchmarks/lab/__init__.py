"""A lab of hosts on one machine (network namespaces on bridges) for tests and benchmarks of raypd
across hosts. The map: docs/architecture.md."""
