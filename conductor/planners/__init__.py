"""The Conductor's planners, run on its tick beside routing: hot-prefix copies and flex nodes' duties; map in docs/architecture.md."""
