"""The OpenAI HTTP protocol: schemas, parameter checks, rendering, stop strings, errors, guard, metrics (docs/architecture.md, cluster/)."""
