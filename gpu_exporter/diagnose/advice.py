"""What to look at next for each bottleneck class: performance advice, given only to a GPU
with no health finding (gpu_exporter/diagnose/health.py outranks it)."""

from __future__ import annotations

from collections.abc import Mapping

ATTENTION_CLASSES = frozenset({"throttled", "launch_bound", "link_bound"})

NEXT_STEPS: Mapping[str, tuple[str, ...]] = {
    "idle": (
        "No kernel ran. If a job should be using this GPU, check that it was given this GPU "
        "(CUDA_VISIBLE_DEVICES, the pod's nvidia.com/gpu allocation) and is not stuck before "
        "its first kernel (data loading, NCCL initialisation, a lock).",
    ),
    "throttled": (
        "The clocks are held down, so every measurement on this GPU understates it.",
        "HW/SW thermal slowdown: check cooling (inlet temperature, airflow, fans, chassis "
        "alerts); `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` shows the limits.",
        "Power brake or HW slowdown without heat: the board or its power supply asserted it; "
        "check the PSUs and the BMC event log.",
    ),
    "launch_bound": (
        "Kernels ran but kept few SMs busy: tiny kernels, launch overhead, host syncs or a "
        "starved input pipeline. Record an Nsight Systems timeline (`nsys profile`) or a "
        "PyTorch Profiler trace and look for gaps between kernels and CPU-side stalls.",
        "Remedies: CUDA Graphs, torch.compile (mode='reduce-overhead'), larger batches, fewer "
        ".item() / .cpu() / torch.cuda.synchronize() calls in the step, more DataLoader workers "
        "with pin_memory=True.",
    ),
    "link_bound": (
        "Transfers dominate: PCIe or NVLink near capacity while the SMs wait.",
        "Check the topology above: do communicating GPUs share NVLink, or cross NODE/SYS? "
        "NCCL_DEBUG=INFO shows the transport NCCL chose.",
        "Overlap communication with compute, keep data on the GPU, and use pinned memory with "
        "non_blocking copies for host transfers; run data loaders on the GPU's NUMA node.",
    ),
    "memory_bound": (
        "HBM bandwidth is the limit (roofline: arithmetic intensity below the ridge point).",
        "Raise intensity: fuse elementwise ops (torch.compile, fused kernels such as "
        "FlashAttention), larger batches for decode, lower precision for activations and KV "
        "cache. Nsight Compute's memory workload analysis confirms it per kernel.",
    ),
    "tensor_bound": (
        "Tensor Cores are the busiest unit: the GPU does what it is built for.",
        "Faster needs cheaper FLOPs: FP8 (Transformer Engine) or lower precision, matrix "
        "dimensions that are multiples of 16, or more GPUs.",
    ),
    "compute_bound": (
        "SMs are busy on non-Tensor-Core work (FP32/FP64/integer pipes).",
        "If the model is matmul-heavy, make the matmuls reach Tensor Cores: bf16/fp16 autocast, "
        "TF32 (torch.backends.cuda.matmul.allow_tf32), dimensions multiple of 8. NVIDIA's DCGM "
        "guidance: SM activity below 0.8 still leaves headroom.",
    ),
    "unknown": (
        "Without SM/Tensor/DRAM activity the class would be a guess, so none is given.",
        "NVML GPM gives these on Hopper and newer; on older GPUs DCGM's profiling fields do: "
        "run with a DCGM host engine (`--dcgm auto`, the daemon's dcgm.mode: "
        "docs/kubernetes.md), or profile with Nsight Systems / PyTorch Profiler.",
    ),
}
# A MIG instance whose activity NVML cannot read: what it is instead of "unknown"'s steps.
MIG_NO_GPM_STEPS: tuple[str, ...] = (
    "NVML reads a MIG instance's activity with GPM, one GPU instance at a time, on Hopper and "
    "newer GPUs only: on an A100 or A30 it gives the instance's memory and size, not its "
    "activity, so no class is given. Nothing is wrong with the instance or the exporter.",
    "For activity per MIG instance here run DCGM (dcgm-exporter's DCGM_FI_PROF_* profiling "
    "fields, which DCGM attributes to MIG devices on A100), or profile the workload inside its "
    "pod with Nsight Systems / PyTorch Profiler.",
)
MIG_SHARED_STEPS: tuple[str, ...] = (
    "GPM measures a GPU instance as a whole; this one is split into several compute "
    "instances, which share its SMs' counters and its memory, so none has activity of its own.",
    "To see one workload's activity, give it a GPU instance of its own (a profile without "
    "compute-instance sharing), or profile it inside its pod with Nsight Systems.",
)
