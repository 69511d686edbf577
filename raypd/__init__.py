"""raypd: LLM serving on Ray with prefill/decode disaggregation; docs/architecture.md is the map.

The repository keeps each package in a top-level folder; installed, they are subpackages of this one
root (`raypd.engine`, `raypd.cluster`, ...). In a checkout, the links in this folder point at them.
"""
__version__ = "0.1.0"
