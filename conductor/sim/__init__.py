"""A discrete-event simulator that drives the real ConductorCore (index, policies, planner) with
simulated prefill and decode nodes on a virtual clock.

  profiles.py   hardware cost models (CPU engine calibration, an 8B-on-H100 profile) and topologies
  workload.py   request streams: the Mooncake conversation trace, generated shared-prefix loads
  cache.py      a node's finite LRU block cache that publishes real KV events
  nodes.py      simulated prefill node (FIFO compute, NIC queue) and decode node (fluid batching)
  simulator.py  the event loop wiring nodes to the Conductor; one run of one policy
  report.py     per-run statistics, the pooled-cache oracle, the goodput sweep
"""
