"""The NIXL backend, what it is created with, and which UCX transports its writes took (docs/architecture.md, kvtransfer/)."""
