"""The engine's GPU paths: Triton kernels and CUDA graphs (docs/architecture.md, engine/gpu/)."""
