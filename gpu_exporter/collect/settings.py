"""The settings of what reads the GPUs, one pydantic model per section of the configuration,
each default with its reason.

Light on purpose (pydantic and this folder's tables, no pynvml, libdcgm or grpc): the
configuration (`gpu_exporter/config/load.py`) composes these models, and the sources are built
from the validated sections themselves.
"""

from __future__ import annotations

import argparse
import os
from typing import Annotated, Any, ClassVar, Literal, get_args
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gpu_exporter.model.activity import BY_DCGM_FIELD
from gpu_exporter.support.validation import SettingsModel, split_commas

# How often every source is read, one snapshot per interval (the top-level interval_seconds),
# and the rules evaluated unless they have an interval of their own.
DEFAULT_INTERVAL_SECONDS = 1.0
# How long a tick waits for a GPU's reads when no deadline is set (`default_deadline`): most of
# the default one-second interval, so that a slow GPU still makes its tick.
DEFAULT_DEVICE_DEADLINE_SECONDS = 0.8
# The default deadline is also capped at this share of the sampling interval, so a tick's reads
# always finish before the next tick starts.
DEADLINE_SHARE_OF_INTERVAL = 0.8


def default_deadline(interval_seconds: float) -> float:
    """The per-GPU deadline when none is configured: the default, or less for short intervals."""
    return min(DEFAULT_DEVICE_DEADLINE_SECONDS, DEADLINE_SHARE_OF_INTERVAL * interval_seconds)


# `Field(default=...)` by keyword throughout: type checkers read a field's default from that
# keyword only (PEP 681), so a positional default would make the field look required.


class NvmlConfig(SettingsModel):
    """`nvml:`, the NVML source's settings (gpu_exporter/collect/nvml/source.py)."""

    # A GPU that has not answered its reads by then is down for this tick, so one hung GPU
    # cannot hold up the others. None: `default_deadline` of the sampling interval (`deadline`);
    # the configuration refuses one that is not shorter than the interval.
    device_deadline_seconds: float | None = Field(default=None, gt=0, le=60)
    # What changes only when an administrator changes it (max clocks, PCIe max link, ECC mode,
    # NVLink state, retired pages) is read this often, not every tick.
    slow_refresh_seconds: float = Field(default=30.0, ge=1, le=86400)
    # After a lost GPU or driver (GPU_IS_LOST): NVML is initialised again after this, doubling
    # up to the maximum, so a GPU gone for good costs one re-init every 5 minutes, not one a
    # tick.
    recovery_initial_backoff_seconds: float = Field(default=2.0, gt=0, le=3600)
    recovery_max_backoff_seconds: float = Field(default=300.0, gt=0, le=86400)
    # A call that hung past the deadline is skipped on that GPU for this long (its thread is
    # abandoned: a ctypes call cannot be cancelled); also how long NVML's start is waited for
    # before it is tried again (nvmlInit without persistence mode takes seconds per GPU).
    hang_quarantine_seconds: float = Field(default=60.0, gt=0, le=86400)
    gpm: bool = True  # the gpm collector: SM/Tensor/DRAM activity from GPM (Hopper and newer)
    # The pcie collector's 20 ms throughput call, on drivers without PCIe byte counters.
    pcie_throughput_fallback: bool = True
    xid_events: bool = True  # the xid collector and its event thread
    # The fabric collector: NVLink fabric state and health (nvmlDeviceGetGpuFabricInfoV, one
    # call per GPU per tick; Hopper and newer on an NVSwitch fabric, absent elsewhere).
    fabric: bool = True
    # The processes collector: NVML's per-process lists and samples, every tick. On with
    # kubernetes.processes.enabled (which maps them to pods); on alone, every process is
    # unattributed.
    processes: bool = False
    # More GPUs than this is refused at start with a clear error (each GPU costs a reader thread).
    max_devices: int = Field(default=64, ge=1, le=4096)

    @model_validator(mode="after")
    def _backoff_order(self) -> NvmlConfig:
        if self.recovery_max_backoff_seconds < self.recovery_initial_backoff_seconds:
            raise ValueError(
                "recovery_max_backoff_seconds is below recovery_initial_backoff_seconds"
            )
        return self

    def deadline(self, interval_seconds: float) -> float:
        """The per-GPU deadline at this sampling interval: the one set, else the default."""
        if self.device_deadline_seconds is not None:
            return self.device_deadline_seconds
        return default_deadline(interval_seconds)


# DCGM profiling field ids the exporter can watch, and the default set, in id order: the
# activity table's (model/activity.py, which says why some are opt-in).
DCGM_FIELDS = tuple(BY_DCGM_FIELD)
DCGM_DEFAULT_FIELDS = tuple(f for f, activity in BY_DCGM_FIELD.items() if activity.dcgm_default)
DcgmMode = Literal["off", "auto", "standalone", "embedded"]
DCGM_MODES: tuple[str, ...] = get_args(DcgmMode)


class DcgmConfig(SettingsModel):
    """`dcgm:`, DCGM's profiling fields for GPUs without GPM (collect/dcgm.py,
    docs/kubernetes.md)."""

    # off: never (the default, opt-in: a GPU has one profiler at a time, and DCGM watching its
    # profiling fields keeps Nsight and other CUPTI tools from it); auto: a host engine at
    # `address` for GPUs without GPM, if libdcgm and the host engine are there; standalone:
    # the same, libdcgm required; embedded: a host engine inside this process (root and
    # CAP_SYS_ADMIN).
    mode: DcgmMode = "off"
    # nv-hostengine's address: host, host:port (DCGM_HE_PORT_NUMBER 5555 by default),
    # [ipv6]:port or unix:/path/to/socket.
    address: str = Field(default="localhost:5555", min_length=1, max_length=4096)
    fields: tuple[int, ...] = Field(default=DCGM_DEFAULT_FIELDS, min_length=1)

    # Not settings (no key in the file): how the source keeps its host-engine session. A
    # connect is given a second; a failed session is made again after 2 s, doubling up to a
    # minute, so a host engine that is gone costs one attempt a minute.
    connect_timeout_seconds: ClassVar[float] = 1.0
    reconnect_initial_backoff_seconds: ClassVar[float] = 2.0
    reconnect_max_backoff_seconds: ClassVar[float] = 60.0

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted `off` as false (and `on` as true).
        if value is False:
            return "off"
        if value is True:
            raise ValueError(
                "a YAML boolean (on/yes/true): write off, auto, standalone or embedded"
            )
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.startswith("unix:"):
            if not value.removeprefix("unix:").removeprefix("//").startswith("/"):
                raise ValueError("a unix socket address is unix:/absolute/path")
            return value
        if value.startswith("["):  # [ipv6]:port
            port = value.partition("]")[2].removeprefix(":")
        elif value.count(":") > 1:  # DCGM's own parser refuses a bare IPv6 address
            raise ValueError(f"write an IPv6 address in brackets: [{value}]:5555")
        else:  # host:port or host
            port = value.partition(":")[2]
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"port {port!r} is not a number from 1 to 65535")
        if any(c.isspace() for c in value) or "/" in value:
            raise ValueError("expected host, host:port, [ipv6]:port or unix:/path")
        return value

    _split_fields = field_validator("fields", mode="before")(split_commas)

    @field_validator("fields")
    @classmethod
    def _known_fields(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        unknown = [v for v in value if v not in DCGM_FIELDS]
        if unknown:
            known = ", ".join(map(str, DCGM_FIELDS))
            raise ValueError(f"unknown DCGM field id(s) {unknown} (known: {known})")
        if len(set(value)) != len(value):
            raise ValueError("a field id is given twice")
        return value


# After a failed refresh the last known pods stay on their GPUs until this many refresh
# intervals after the last success: one kubelet hiccup must not drop every pod label at once
# (each series would end and start again), while a pod that finished during a long outage
# must not stay attributed for long.
STALE_AFTER_REFRESHES = 3


class ProcessesConfig(SettingsModel):
    """`kubernetes.processes:`, per-process attribution: which container each GPU process runs
    in (gpu_exporter/collect/k8s/processes.py and runtime.py; docs/workloads.md)."""

    # Off by default: it needs the host's PID namespace (hostPID: NVML lists only the caller's
    # namespace's processes) and the container runtime's socket, which the default DaemonSet
    # does not get.
    enabled: bool = False
    # The /proc of the host's PID namespace, which the daemon runs in (checked every tick).
    proc_root: str = Field(default="/proc", min_length=1)
    # The container runtime's CRI socket; auto: the first of containerd's, CRI-O's and
    # cri-dockerd's default paths that exists.
    runtime_socket: str = Field(default="auto", min_length=1)
    # How often the runtime is asked for its containers (sooner when a process of an unknown
    # container appears), and how long one answer may take.
    refresh_seconds: float = Field(default=10.0, ge=1, le=3600)
    timeout_seconds: float = Field(default=2.0, gt=0, le=60)


class DraConfig(SettingsModel):
    """`kubernetes.dra:`, devices the kubelet reports as allocated through Dynamic Resource
    Allocation (PodResources `dynamic_resources`): each (driver, pool, device) becomes a GPU or
    MIG UUID through the node's ResourceSlices, read from the API server
    (gpu_exporter/collect/k8s/resource_slices.py; docs/kubernetes.md "DRA")."""

    # Off by default: it needs a ServiceAccount token allowed to list and watch ResourceSlices,
    # which the default DaemonSet does not mount.
    enabled: bool = False
    # The API server, an https:// URL (the token goes with every request); auto:
    # https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (in-cluster).
    api_server: str = Field(default="auto", min_length=1)
    # The ServiceAccount's token (re-read as the kubelet rotates it) and the cluster's CA.
    token_file: str = Field(
        default="/var/run/secrets/kubernetes.io/serviceaccount/token", min_length=1
    )
    ca_file: str = Field(
        default="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", min_length=1
    )
    # This node's name, as ResourceSlices' spec.nodeName has it; "" takes $NODE_NAME (the
    # chart sets it from the downward API's spec.nodeName).
    node_name: str = ""
    # The DRA drivers whose devices are GPUs (NVIDIA's: gpu.nvidia.com).
    drivers: list[str] = Field(default=["gpu.nvidia.com"], min_length=1)
    # How long one list request may take (a whole list, all its pages: 3 times that); a watch
    # silent for longer than its server-side timeout (60 to 120 s) plus this is restarted.
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)

    _lists = field_validator("drivers", mode="before")(split_commas)

    @field_validator("api_server")
    @classmethod
    def _api_server(cls, value: str) -> str:
        return value if value == "auto" else cls.https_url(value)

    @staticmethod
    def https_url(value: str) -> str:
        """`value` if it is an https:// URL with a host (and a port from 1 to 65535, if any);
        else ValueError. The ServiceAccount's bearer token must not travel in clear text."""
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError as error:  # a bad port or IPv6 literal
            raise ValueError(f"{value!r} is not a URL: {error}") from None
        if parts.scheme != "https":
            raise ValueError(
                f"must be auto or an https:// URL, not {value!r}: the ServiceAccount token "
                "goes with every request, never in clear text"
            )
        if not parts.hostname or any(c.isspace() for c in value) or parts.query or parts.fragment:
            raise ValueError(f"{value!r} is not an https://host[:port] URL")
        if port == 0:
            raise ValueError(f"{value!r}: port 0 is not a port")
        return value


class KubernetesConfig(SettingsModel):
    """`kubernetes:`, pod attribution from the kubelet's PodResources API
    (gpu_exporter/collect/k8s/attribution.py)."""

    # auto: on when the kubelet socket exists at start (a DaemonSet), off elsewhere.
    enabled: Literal["auto", "true", "false"] | bool = "auto"
    socket_path: str = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's default
    # How often the kubelet is asked: a finished pod's labels disappear at the next refresh.
    refresh_seconds: float = Field(default=10.0, ge=1, le=3600)
    # How long one kubelet call may take (a hung kubelet must not hold the refresh thread).
    timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    # Extended resources whose devices are GPUs (device plugins that advertise other names add
    # theirs, e.g. a time-slicing `nvidia.com/gpu.shared`), and resource name prefixes whose
    # devices are GPUs: every MIG profile's resource (MIG strategy "mixed").
    resource_names: list[str] = Field(default=["nvidia.com/gpu"])
    resource_prefixes: list[str] = Field(default=["nvidia.com/mig-"])
    # labels: namespace/pod/container on every per-GPU series; info: only gpu_pod_info.
    mode: Literal["labels", "info"] = "labels"
    # How long a failing kubelet's last pod labels are kept after its last success (None:
    # STALE_AFTER_REFRESHES refresh intervals); 0 clears them at the first failure.
    stale_after_seconds: float | None = Field(default=None, ge=0, le=86400)
    processes: ProcessesConfig = ProcessesConfig()
    dra: DraConfig = DraConfig()

    _lists = field_validator("resource_names", "resource_prefixes", mode="before")(split_commas)

    def active(self) -> bool:
        """Whether pods are attributed: `auto` asks whether the kubelet socket is there."""
        if self.enabled in (True, "true"):
            return True
        if self.enabled in (False, "false"):
            return False
        return os.path.exists(self.socket_path)

    @property
    def grace_seconds(self) -> float:
        """How long after the last success a failing kubelet's last pods are kept."""
        if self.stale_after_seconds is not None:
            return self.stale_after_seconds
        return STALE_AFTER_REFRESHES * self.refresh_seconds

    def wants(self, resource_name: str) -> bool:
        """Whether the devices of this extended resource are GPUs."""
        return resource_name in self.resource_names or resource_name.startswith(
            tuple(self.resource_prefixes)
        )


# The classifier's window is never shorter by default (`default_window_seconds`).
MIN_WINDOW_SECONDS = 5.0


def default_window_seconds(interval_seconds: float) -> float:
    """The classifier's window when none is configured: 5 s, or three intervals if longer, so
    that counter rates always have at least two points in it."""
    return max(MIN_WINDOW_SECONDS, 3 * interval_seconds)


Ratio = Annotated[float, Field(ge=0, le=1)]


class ClassifierConfig(SettingsModel):
    """`classifier:`, where one bottleneck class ends and the next begins
    (gpu_exporter/collect/classify.py). All thresholds are ratios, 0..1."""

    # NVML utilization is the share of time *any* kernel ran; under 5 % the GPU is not running
    # a workload (the gpu_idle clock event is set at such loads too).
    idle_utilization: Ratio = 0.05
    # HW slowdown cuts clocks by half or more (nvml.h), so clocks held for 20 % of the window
    # cost at least 10 % throughput; the shipped HW-slowdown alert fires at the same share
    # (rules/gpu-exporter.rules.yaml, avg_over_time(...) > 0.2).
    throttle_fraction: Ratio = 0.2
    # NVIDIA's DCGM guidance: SM activity >= 0.8 is necessary for efficient use, < 0.5 likely
    # means ineffective use. Below 0.5 the SMs are mostly empty (launch, link); at or above it
    # the SMs are the busy unit (compute/tensor). 0.5-0.8 still has headroom, which `diagnose`
    # says in its advice.
    sm_active_low: Ratio = 0.5
    # DRAM_BW_UTIL is bandwidth as a fraction of peak; STREAM-like kernels reach about 80-90 %
    # of peak, so at 70 % the workload sits on the memory roof of the roofline (P <= I x BW);
    # the same bound as the shipped memory-bound alert.
    dram_active_high: Ratio = 0.7
    # Tensor pipes active in half of all cycles or more make the matrix units the busiest unit;
    # well-tuned LLM training reaches about 0.5-0.7. Below that, time goes to non-tensor work
    # even if Tensor Cores are used (compute_bound).
    tensor_active_high: Ratio = 0.5
    # Observed bytes/s per direction over the link's theoretical payload rate
    # (classify.PCIE_LANE_BYTES_PER_SECOND, NVLINK_LINK_BYTES_PER_SECOND). Practical peaks are
    # about 80-90 % of theoretical (protocol overhead), so 60 % of theoretical is about 70 % of
    # what the link can actually move: near capacity.
    link_utilization_high: Ratio = 0.6
    # How far back the checks look. None: `default_window_seconds` of the sampling interval
    # (`window`).
    window_seconds: float | None = Field(default=None, gt=0, le=3600)

    def window(self, interval_seconds: float) -> float:
        """The window at this sampling interval: the one set, else the default."""
        if self.window_seconds is not None:
            return self.window_seconds
        return default_window_seconds(interval_seconds)


def add_dcgm_arguments(parser: argparse.ArgumentParser, address_default: str | None) -> None:
    """`--dcgm MODE` and `--dcgm-address`, for serve (None: the configuration's address) and
    diagnose."""
    parser.add_argument(
        "--dcgm",
        choices=DCGM_MODES,
        help="SM/Tensor/DRAM activity from DCGM for GPUs without GPM (dcgm.mode, "
        "docs/kubernetes.md); default off, auto on a simulated node with a DCGM host engine",
    )
    parser.add_argument(
        "--dcgm-address",
        default=address_default,
        metavar="ADDRESS",
        help=f"nv-hostengine address: host, host:port or unix:/path (default "
        f"{DcgmConfig().address})",
    )
