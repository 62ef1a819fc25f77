"""`gpu-exporter diagnose`: a one-shot report on this node's GPUs, in the order a diagnosis
reads it: health first; then whether the workload is steady and comparable; then where the time
goes; then the hot spots' advice. It profiles the node for `--duration` seconds with the
production NVML source, the bottleneck classifier and the daemon's health rules, then reports:

1. Health: the shipped rule pack's `gpu-health` group evaluated over the profile's series by
   the daemon's own rule engine (`health.py`; `--health-rules` for another pack), so
   "unhealthy" means what the alerts mean. The section opens with the verdicts (`verdict.py`):
   the node's, the worst of its GPUs', then each GPU's as the daemon's latch holds it at the end
   of the profile (verdict, next step, reason); `--json` adds `health_validation`, the node's
   verdict in NVIDIA Health Validation's shape. Each finding has ordered next steps (drain,
   collect `nvidia-bug-report.sh`, reset, replace), which are that GPU's next steps: an
   unhealthy GPU gets no performance advice and its time is not counted below. XIDs before the
   run are only in the kernel log: the report says where.
2. Steady and comparable (`comparable.py`): versions (driver, NVML, CUDA driver API, the Python
   binding, the exporter); per GPU its SM clock while busy over the profile (range against the
   maximum, steady or not) and its settings (power limit against its default, persistence, ECC,
   application clocks, MIG and compute mode), read each tick and once after the profile
   (`config_checks.py` judges them against their defaults); drift: a setting that differs between
   GPUs of one model (or the driver between any two), or that changed during the profile; and
   what was not read, said rather than assumed. The GPUs' state at the end of the profile
   (clocks, power, clock-event reasons, PCIe and NVLink links; a GPU that is down shows none of
   these, only why) belongs here too.
3. Where the time goes (`time_shares.py`): the topology, as `nvidia-smi topo -m`, and what it
   means (`topology_notes.py`); the activity profile (utilization next to SM / Tensor / DRAM
   activity, link traffic, the class and its one-line reason, with pods the pod holding each
   GPU); then each GPU's seconds per class over the profile as shares, grouped in the order to
   look: idle gaps, copy-dominated (PCIe), collective-dominated (NVLink), launch bound, memory
   bound, compute bound, then throttled and unknown time; for each category what to look at and
   what the counters cannot tell apart, and what they do not measure (a NIC's traffic).
4. Hot spots: what to look at next for each healthy GPU's class (`advice.py`), in the order of
   its category.

MIG: a GPU with MIG enabled has no class of its own; its MIG instances are listed under it,
each with its profile, class, pods and memory, and judged as a whole GPU is (a launch-bound
instance needs attention and gets the same advice). NVML reads an instance's activity with
GPM, per GPU instance, on Hopper and newer only: an A100/A30 instance (or a compute instance
of a GPU instance split into several) says its activity is unavailable and why, instead of a
generic "unknown".

Pods: with the kubelet's PodResources socket (`--kubelet-socket`, by default the kubelet's
own path when it exists and the node is not simulated), each GPU and MIG instance names the
pods holding it, read once before the profile, as the daemon's pod attribution reads them.
With per-process attribution (the gpu_pod_* families in the profile's series), each GPU and MIG
instance also lists every container's use of it over the profile (`pod_use`: processes and
memory at the end, utilization, encoder and decoder shares as means over the ticks that
measured them, energy charged during the profile and how) and the processes of no known
container (`unattributed`), in the JSON and in a per-pod table under the activity profile.
Idle allocations (`idle_allocations`, `pod_profile.py`) are GpuAllocatedButIdle's condition
over the profile instead of 30 minutes: a container holds a device classed idle over the
profile, or runs no process on it, or its processes run no kernel on it. On a healthy GPU they
need attention, as a cost rather than a fault of the GPU: they are listed under "Needs
attention", not among the GPU's problems.

Exit status: 0 nothing needs attention; 1 something does; 2 bad input (flags, scenario, health
rule files); 3 no NVIDIA driver to read: NVML cannot start, or its start (nvmlInit, the GPU
count, XID registration) does not answer within `--start-timeout`, which names the stuck step
and how long it waited (a driver that hangs there gives nothing to report on; a GPU whose own
start calls hang is down in the report instead, with why). "Needs attention" means a GPU that
is down, a health finding (an alert of the gpu-health group pending or firing during the
profile, about a GPU or the node), a node verdict of warning or critical (info and pass are no
reason by themselves), NVLink links down or P2P over NVLink unavailable, settings drift (a
setting that differs between GPUs of one model, or the driver between GPUs, or one that changed
during the profile), a setting warning (power limit below its default, persistence mode off,
ECC or MIG mode change pending, application clocks changed, compute mode Prohibited), and on a
healthy GPU clocks held down by a HW / thermal / power-brake reason, a class in
ATTENTION_CLASSES (throttled, launch_bound and link_bound waste a GPU that is nominally busy)
or an idle allocation. memory_bound is reported but is not a fault: on the roofline,
low-intensity work (LLM decode, elementwise ops) is memory-bound by nature; idle (unless a pod
holds the GPU: an idle allocation), tensor_bound and compute_bound are not problems, and
unknown means missing data, not a fault. Notes (XIDs the pack does not alert on, ECC errors
from before the run, setting notes, topology notes) never change the exit status.

Imports `collect`, `alerting`, `sim`, `model` and `support`; not `config` (what it needs comes
from its own flags) nor `pipeline` (checked in CI: `lint-imports`).
"""

from __future__ import annotations

from gpu_exporter.diagnose.advice import (
    ATTENTION_CLASSES,
    MIG_NO_GPM_STEPS,
    MIG_SHARED_STEPS,
    NEXT_STEPS,
)
from gpu_exporter.diagnose.command import (
    DEFAULT_START_TIMEOUT_SECONDS,
    MAX_START_TIMEOUT_SECONDS,
    add_arguments,
    add_parser,
    check_arguments,
    main,
    run,
    use_colour,
)
from gpu_exporter.diagnose.exit_status import (
    EXIT_ATTENTION,
    EXIT_NO_DRIVER,
    EXIT_OK,
    EXIT_USAGE,
)
from gpu_exporter.diagnose.health import HEALTH_GROUP, HEALTH_STEPS, HealthRules
from gpu_exporter.diagnose.report import SCHEMA_VERSION, build_report

__all__ = [
    "ATTENTION_CLASSES",
    "DEFAULT_START_TIMEOUT_SECONDS",
    "EXIT_ATTENTION",
    "EXIT_NO_DRIVER",
    "EXIT_OK",
    "EXIT_USAGE",
    "HEALTH_GROUP",
    "HEALTH_STEPS",
    "MAX_START_TIMEOUT_SECONDS",
    "MIG_NO_GPM_STEPS",
    "MIG_SHARED_STEPS",
    "NEXT_STEPS",
    "SCHEMA_VERSION",
    "HealthRules",
    "add_arguments",
    "add_parser",
    "build_report",
    "check_arguments",
    "main",
    "run",
    "use_colour",
]
