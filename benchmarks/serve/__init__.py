"""`raypd bench serve`: a serving system measured over its OpenAI HTTP API against another, with goodput sweeps; map in docs/architecture.md."""
