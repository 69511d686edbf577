"""Tests of the node pool's scaling: the Conductor's retirement, the supervisor's drains and
additions, the pool scaler's loop, and a real drain that loses nothing."""
