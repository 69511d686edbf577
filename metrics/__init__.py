"""The one seam to Ray's metrics API, shared by the node, Conductor and ingress metrics (docs/architecture.md, metrics/)."""
