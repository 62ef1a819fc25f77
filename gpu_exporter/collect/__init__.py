"""Everything that reads the world: NVML (whole GPUs, MIG instances, GPM), DCGM's profiling
fields, topology, the kubelet's pod attribution, and the bottleneck classifier that reads a
window of snapshots.

Imports `model` and `support` only (checked in CI: `lint-imports`).
"""
