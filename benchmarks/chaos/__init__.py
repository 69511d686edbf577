"""`raypd bench chaos`: nodes and the Conductor killed under streaming load, every output checked against a fault-free run; map in docs/architecture.md."""
