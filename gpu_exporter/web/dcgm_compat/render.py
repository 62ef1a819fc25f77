"""A tick's series -> dcgm-exporter 4.8's text exposition, byte for byte in its format.

Written directly, not with prometheus_client: that would add `_total` to counters, sort the
label names and print `40000.0`, and each of those breaks a query or a fixed-order parser
written against dcgm-exporter. What is kept from its renderer (NVIDIA/dcgm-exporter,
internal/pkg/rendermetrics/render_metrics.go, and collector/gpu_collector.go):

- the families of the selection (selection.py: the default, or a counters file's) in its
  order, each with its `# HELP` and `# TYPE` line;
- labels in its order: `gpu`, `UUID`, `pci_bus_id` (`00000000:XX:YY.Z`, upper case),
  `device` (`nvidia<gpu>`), `modelName`, on a GPU instance `GPU_I_PROFILE` and `GPU_I_ID`,
  `hostname` (or `Hostname`), the selection's label rows (`DCGM_FI_DRIVER_VERSION` by
  default), then in name order `container`, `err_code`, `err_msg`, `namespace`, `pod`;
- one series per pod holding the device (several under time-slicing), none attributed when
  no pod holds it;
- on a device several pods share, with per-pod use (per-process attribution), what
  `--kubernetes-virtual-gpus` does to DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED
  (internal/pkg/transformation/kubernetes.go and process_metrics.go): the device's own series
  without pod labels, then one per pod holding it valued by that pod's processes (`_PER_POD`);
- `%d` for DCGM's integer fields and `%f` for its doubles; a value DCGM would leave blank is
  absent, never 0.

Everything comes from the series list (`SeriesSet.devices()`), the one model the native
exposition, the rules and the API read too, so the two endpoints cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_exporter.model.series import DeviceView, InstanceView, Series, SeriesSet
from gpu_exporter.model.snapshot import Labels, Reading
from gpu_exporter.web.dcgm_compat.fields import RATE_FAMILIES, CompatField, Entity, index
from gpu_exporter.web.dcgm_compat.selection import DEFAULT, Family, Label, Selection
from gpu_exporter.web.dcgm_compat.xid_messages import message

_XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
# The fields dcgm-exporter's virtual-GPU mode gives per sharing pod from its processes, and the
# per-pod family each is computed from (the same unit as the field's native family).
_PER_POD = {
    "DCGM_FI_DEV_GPU_UTIL": "gpu_pod_utilization_ratio",
    "DCGM_FI_DEV_FB_USED": "gpu_pod_memory_used_bytes",
}
PodKey = tuple[str, str]  # (namespace, pod): dcgm-exporter sums a pod's processes by pod UID
_COMPUTE_PREFIX = re.compile(r"^\d+c\.")  # "1c.3g.40gb": a compute instance of a 3g.40gb


@dataclass(frozen=True)
class Counters:
    """One tick's series of the RATE_FAMILIES (references to its rows, not copies): what the
    next tick's rates need of it."""

    timestamp: float
    rows: Mapping[str, tuple[Series, ...]]

    @classmethod
    def of(cls, series: SeriesSet) -> Counters:
        return cls(series.timestamp, {family: series.of(family) for family in RATE_FAMILIES})


@dataclass(frozen=True)
class _Target:
    """One entity with the labels its series carry before the per-pod and XID labels."""

    entity: Entity
    prefix: str  # 'gpu="0",UUID="...",...' up to the driver version
    pods: tuple[tuple[str, str, str], ...]
    # Per _PER_POD family, each pod's sum over its containers on the device (empty without
    # per-process attribution).
    pod_use: Mapping[str, Mapping[PodKey, float]] = dataclasses.field(default_factory=dict)

    def per_pod(self, field_name: str) -> Mapping[PodKey, float] | None:
        """The per-pod values of `field_name` when the device is shared and has them."""
        family = _PER_POD.get(field_name)
        if family is None or len(self.pods) < 2:
            return None
        return self.pod_use.get(family)


def render(
    current: SeriesSet,
    previous: Counters | None,
    hostname: tuple[str, str] | None,
    selection: Selection = DEFAULT,
) -> bytes:
    """The compat exposition of `current`; rates from `previous`, the tick before it.
    `hostname`: the node's label as (name, value), "hostname" (dcgm-exporter 4.8.3 and later)
    or "Hostname" (before) and the node's name; None leaves it out (dcgm-exporter's `-n`).
    `selection`: the families and label rows to write."""
    rates = _rates(current, previous)
    targets = [
        target
        for view in current.devices()
        for target in _targets(view, rates, hostname, selection.labels)
    ]
    parts: list[str] = []
    for family in selection.families:
        lines = _field_lines(family, targets)
        if lines:
            name = family.name
            parts.append(
                f"# HELP {name} {_escape_help(family.help)}\n# TYPE {name} {family.type}\n"
            )
            parts.extend(lines)
    return "".join(parts).encode()


def _field_lines(family: Family, targets: Sequence[_Target]) -> list[str]:
    field, name, lines = family.field, family.name, []
    for target in targets:
        if not target.entity.shows(field.of):
            continue
        value = field.value(target.entity)
        if value is None or not math.isfinite(value):
            continue
        text = _number(value, field)
        per_pod = target.per_pod(field.name)
        if per_pod is not None:
            # The device's own series, then each sharing pod's: the sum over its processes,
            # 0 for a pod with none (as dcgm-exporter's buildIdlePodValues).
            lines.append(f"{name}{{{target.prefix}}} {text}\n")
            for namespace, pod, container in target.pods:
                own = per_pod.get((namespace, pod), 0.0) * field.scale
                labels = _attributes({"container": container, "namespace": namespace, "pod": pod})
                lines.append(f"{name}{{{target.prefix}{labels}}} {_number(own, field)}\n")
            continue
        extra: dict[str, str] = {}
        if field.name == _XID_FIELD:
            extra = {"err_code": text, "err_msg": message(int(text))}
        for namespace, pod, container in target.pods or (("", "", ""),):
            attributes = {
                **extra,
                "container": container,
                "namespace": namespace,
                "pod": pod,
            }
            lines.append(f"{name}{{{target.prefix}{_attributes(attributes)}}} {text}\n")
    return lines


def _attributes(attributes: Mapping[str, str]) -> str:
    """The per-pod and XID labels, after the fixed ones: in name order, blanks left out."""
    return "".join(
        f',{name}="{_escape(value)}"' for name, value in sorted(attributes.items()) if value
    )


def _number(value: float, field: CompatField) -> str:
    if not field.integer:
        return "%f" % value  # noqa: UP031 - Go's %f is exactly this
    return str(math.floor(value) if field.floor else round(value))


def _targets(
    view: DeviceView,
    rates: Mapping[int, Mapping[tuple[str, Labels], float]],
    hostname: tuple[str, str] | None,
    rows: Sequence[Label],
) -> Iterable[_Target]:
    """A GPU's compat entities: itself, or with MIG instances, one per GPU instance plus its
    own additive quantities (see fields.Of)."""
    parent, own_rates = index(view.readings), rates.get(view.index, {})
    if not view.instances:
        entity = Entity(parent, parent, own_rates)
        pods = _pods(view.readings)
        yield _Target(entity, _prefix(view, hostname, rows), pods, _pod_use(view.readings))
        return
    parent_prefix = _prefix(view, hostname, rows)
    yield _Target(Entity({}, parent, own_rates, parent_only=True), parent_prefix, ())
    by_gi: dict[int, list[InstanceView]] = {}
    for instance in view.instances:
        if instance.gpu_instance_id is not None:
            by_gi.setdefault(instance.gpu_instance_id, []).append(instance)
    for gi, instances in sorted(by_gi.items()):
        # A GPU instance split into compute instances: its memory and activity belong to
        # none of them alone, and the series list has no GPU-instance-level copy of them.
        single = instances[0] if len(instances) == 1 else None
        alone = single is not None and single.compute_instance_id is None
        own = index(single.readings) if single is not None and alone else {}
        profile = _COMPUTE_PREFIX.sub("", instances[0].identity.get("mig_profile", ""))
        readings = [reading for instance in instances for reading in instance.readings]
        entity = Entity(own, parent, own_rates, instance=True)
        prefix = _prefix(view, hostname, rows, (profile, str(gi)))
        yield _Target(entity, prefix, _pods(readings), _pod_use(readings))


def _prefix(
    view: DeviceView,
    hostname: tuple[str, str] | None,
    rows: Sequence[Label],
    mig: tuple[str, str] | None = None,
) -> str:
    labels = [
        ("gpu", str(view.index)),
        ("UUID", view.uuid),
        ("pci_bus_id", dcgm_bus_id(view.info.get("pci_bus_id", ""))),
        ("device", f"nvidia{view.index}"),
        ("modelName", view.info.get("model", "")),
    ]
    if mig is not None:
        labels += [("GPU_I_PROFILE", mig[0]), ("GPU_I_ID", mig[1])]
    if hostname is not None:
        labels.append(hostname)
    labels += [(row.name, view.info.get(row.field.info, "")) for row in rows]
    # dcgm-exporter writes its fixed labels even when blank; a blank label row (a driver
    # version DCGM left blank) it drops. Here every blank is dropped: Prometheus reads an
    # empty label as absent anyway.
    return ",".join(f'{name}="{_escape(value)}"' for name, value in labels if value)


def dcgm_bus_id(bus_id: str) -> str:
    """NVML's `busId` form, as dcgm-exporter prints it: 0000:3b:00.0 -> 00000000:3B:00.0."""
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id.upper()
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return bus_id.upper()


def _pods(readings: Iterable[Reading]) -> tuple[tuple[str, str, str], ...]:
    return tuple(dict.fromkeys(InstanceView.pods_of(readings)))


def _pod_use(readings: Iterable[Reading]) -> dict[str, dict[PodKey, float]]:
    """Per _PER_POD family, each pod's value summed over its containers (dcgm-exporter maps a
    process to its pod by the pod UID in its cgroup, so a pod's containers add up)."""
    families = set(_PER_POD.values())
    use: dict[str, dict[PodKey, float]] = {}
    for reading in readings:
        if reading.family in families:
            labels = dict(reading.labels)
            key = (labels.get("namespace", ""), labels.get("pod", ""))
            values = use.setdefault(reading.family, {})
            values[key] = values.get(key, 0.0) + reading.value
    return use


def _rates(
    current: SeriesSet, previous: Counters | None
) -> dict[int, dict[tuple[str, Labels], float]]:
    """Per GPU index, the per-second rate of each RATE_FAMILIES series of a whole GPU between
    the two ticks; none across a counter reset, a GPU's UUID change or a missing tick."""
    rates: dict[int, dict[tuple[str, Labels], float]] = {}
    if previous is None:
        return rates
    seconds = current.timestamp - previous.timestamp
    if not seconds > 0:
        return rates
    for family in RATE_FAMILIES:
        # Matched on the GPU and the family's own labels only: pods coming or going (labels
        # mode) change a series' labels, not its counter.
        before = {_counter_key(row.labels): row.value for row in previous.rows.get(family, ())}
        for row in current.of(family):
            key = _counter_key(row.labels)
            earlier = before.get(key)
            if earlier is None or row.value < earlier or key[2] or not key[0].isdecimal():
                continue  # no tick before, a counter reset, a MIG instance, no GPU index
            own = tuple((k, v) for k, v in row.labels if k == "direction")
            per_second = (row.value - earlier) / seconds
            rates.setdefault(int(key[0]), {})[(family, own)] = per_second
    return rates


def _counter_key(labels: Labels) -> tuple[str, str, str, str]:
    """(gpu, uuid, mig_uuid, direction) of a byte counter's series."""
    values = dict(labels)
    return (
        values.get("gpu", ""),
        values.get("uuid", ""),
        values.get("mig_uuid", ""),
        values.get("direction", ""),
    )


def _escape_help(text: str) -> str:
    """A help text as the text format writes it (a counters file's may hold line breaks)."""
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
