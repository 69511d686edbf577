"""The Ray Serve deployments: the OpenAI ingress and the NodePool (docs/architecture.md, cluster/)."""
