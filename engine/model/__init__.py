"""The model and how it is loaded (docs/architecture.md, engine/)."""
