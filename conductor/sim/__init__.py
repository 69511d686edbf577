"""A discrete-event simulator driving the real ConductorCore with simulated nodes on a virtual clock; map in docs/architecture.md."""
