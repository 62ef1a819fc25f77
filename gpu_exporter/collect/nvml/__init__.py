"""The NVML source: one reader thread per GPU, a deadline on every call, and the per-area
collectors (`collectors/`) that turn NVML's answers into readings."""
