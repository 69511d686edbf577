"""The vocabulary the Conductor and the nodes share, torch-free (docs/architecture.md)."""
