"""Driving one request through the nodes: routers, the request driver, the token receiver (docs/architecture.md, cluster/)."""
