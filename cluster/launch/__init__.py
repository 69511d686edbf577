"""Starting Ray and placing node actors (docs/architecture.md, cluster/)."""
