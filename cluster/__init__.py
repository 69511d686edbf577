"""raypd's deployment surface: CLI, launcher, request client, OpenAI protocol and Serve deployments; map in docs/architecture.md."""
