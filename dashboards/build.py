"""Generate gpu-exporter's Grafana dashboards (Grafana JSON model, schemaVersion 41).

    python dashboards/build.py           # (re)write dashboards/*.json
    python dashboards/build.py --check   # exit 1 when a committed file differs from the output

Built on grafana-foundation-sdk, Grafana's typed builders and models for its JSON (the release
for Grafana 11.6), with one small helper per panel kind below. Its validation is static: mypy,
whose scope includes dashboards/, rejects what the SDK's types do not allow (`GridPos(h="x")`,
an option the panel kind does not have, a misspelt or wrong enum member); at run time the SDK
checks nothing. tests/test_dashboards.py also type-checks the output against @grafana/schema,
which is newer than the SDK: the few defaults the SDK writes that this schema does not have are
unset where they are written. Besides the SDK, only `gpu_exporter.model` (nvml_facts, xids:
standard library only) is imported: the clock-event reason names and XID lists come from there.

Three dashboards:
- gpu-efficiency.json  is each GPU doing useful work, and if not, why (bottleneck class)? Its
                       workloads row: each pod's utilization share, memory and power charged,
                       and idle allocations (GpuAllocatedButIdle, pods at a 0 share);
- gpu-health.json      throttling, clocks, power, temperature, links, errors, exporter health;
- gpu-fleet.json       cluster-wide efficiency, waste by namespace, top offenders, down GPUs,
                       and per namespace GPU-hours allocated and used, energy, idle
                       allocations; built on rules/gpu-exporter.recording.yaml.

Conventions every panel follows (tests/test_dashboards.py checks them):
- queries go to the `${datasource}` variable; every panel has a unit and a description;
- per-GPU queries honour the cluster/node/gpu variables through `sel()` and the namespace/pod
  variables through `scoped()`, which works in both pod-attribution modes of the exporter;
- a missing series that means zero is shown as 0 (`or ... * 0`, `or vector(0)`); one that means
  "not measured" (activity metrics before Hopper, ECC when disabled) stays empty, and the
  panel's description says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Self

from grafana_foundation_sdk.builders import bargauge as bargauge_sdk
from grafana_foundation_sdk.builders import common as common_sdk
from grafana_foundation_sdk.builders import dashboard as dashboard_sdk
from grafana_foundation_sdk.builders import prometheus as prometheus_sdk
from grafana_foundation_sdk.builders import stat as stat_sdk
from grafana_foundation_sdk.builders import statetimeline as statetimeline_sdk
from grafana_foundation_sdk.builders import table as table_sdk
from grafana_foundation_sdk.builders import timeseries as timeseries_sdk
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as grafana
from grafana_foundation_sdk.models import prometheus as prometheus_model
from grafana_foundation_sdk.models import statetimeline as statetimeline_model
from grafana_foundation_sdk.models import table as table_model

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script from a source tree
    sys.path.insert(0, str(HERE.parent))

from gpu_exporter.model.nvml_facts import (  # noqa: E402 - after the path it may need
    APPLICATIONS_CLOCKS_SETTING,
    CLOCK_EVENT_REASONS,
    DISPLAY_CLOCK_SETTING,
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    SYNC_BOOST,
)
from gpu_exporter.model.xids import CRITICAL_XIDS, WARNING_XIDS  # noqa: E402

DATASOURCE = grafana.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["gpu", "gpu-exporter"]

# --- PromQL vocabulary ---------------------------------------------------------------------------

CLUSTER = 'cluster=~"$cluster"'
GPU_MATCHERS = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'
POD_MATCHERS = 'cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"'
BY_GPU = "cluster, node, gpu, uuid"
GPU_LEGEND = "{{node}} GPU {{gpu}}"

# A device is a whole GPU or a MIG instance: an instance's series carry its parent's gpu and
# uuid plus gpu_instance, mig_uuid and mig_profile (mig_uuid is absent, i.e. "", on a whole GPU),
# so per-device queries key on (uuid, mig_uuid). A MIG parent has no utilization or activity of
# its own (its power, clocks and links are the health dashboard's, per GPU as before).
DEVICE = "uuid, mig_uuid"
BY_DEVICE = f"{BY_GPU}, gpu_instance, mig_uuid, mig_profile"
DEVICE_LEGEND = GPU_LEGEND + " {{mig_profile}} {{gpu_instance}}"
INSTANCE_LEGEND = "{{node}} {{mig_profile}} {{gpu_instance}}"  # in a panel for one GPU index

# A device is in scope when the pod holding it matches the namespace/pod variables (gpu_pod_info,
# emitted in both attribution modes), or when no pod holds it and the variables are All: gpu_up
# and gpu_mig_instance_slices have no namespace/pod then, and the empty value matches their
# ".*" All value. A MIG parent (its own series: power, clocks, ...) is in scope too when one of
# its instances is.
IN_SCOPE = (
    f"(gpu_pod_info{{{POD_MATCHERS}}} or gpu_up{{{POD_MATCHERS}}}"
    f" or gpu_mig_instance_slices{{{POD_MATCHERS}}}"
    f' or max by (uuid) (gpu_pod_info{{{POD_MATCHERS}, mig_uuid!=""}}))'
)

# Whom to charge a device's readings that carry no pod labels, one series per (device, pod):
# the pods holding it by gpu_pod_info in "info" mode; nobody (empty namespace and pod) for a
# free device and in "labels" mode, where such readings were taken while no pod held the device
# (a device whose current readings carry pod labels is in labels mode). A MIG parent with
# instances is nobody's: its instances are.
UNLABELLED_OWNER = (
    f"(max by (cluster, {DEVICE}, namespace, pod) (gpu_pod_info{{{POD_MATCHERS}}})"
    f" unless on ({DEVICE})"
    ' (gpu_utilization_ratio{pod!=""} or gpu_mig_instance_slices{pod!=""})'
    f" or on ({DEVICE})"
    f" max by (cluster, {DEVICE}) (gpu_mig_instance_slices{{{POD_MATCHERS}}}) * 0 + 1"
    f" or on (uuid) max by (cluster, uuid) (gpu_up{{{POD_MATCHERS}}}) * 0 + 1)"
)

# Bottleneck classes (gpu_exporter/collect/classify.py), with the code the
# state-timeline panels encode each class as, and its colour.
CLASSES: tuple[tuple[str, str, str], ...] = (
    ("idle", "idle", "#808080"),
    ("throttled", "throttled", "red"),
    ("launch_bound", "launch-bound", "orange"),
    ("link_bound", "link-bound", "purple"),
    ("memory_bound", "memory-bound", "yellow"),
    ("tensor_bound", "tensor-bound", "green"),
    ("compute_bound", "compute-bound", "blue"),
    ("unknown", "unknown", "#4d4d4d"),
)
BUSY_BUT_IDLE = 'class=~"launch_bound|link_bound"'

# Clock-event reasons that slow a GPU down, mildest first, as the health state timeline
# encodes them (SW power cap is normal operation at the limit; the others are protective).
SLOWDOWN_REASONS: tuple[tuple[str, str, str], ...] = (
    (SW_POWER_CAP.name, "SW power cap", "blue"),
    (SW_THERMAL_SLOWDOWN.name, "SW thermal", "orange"),
    (HW_SLOWDOWN.name, "HW slowdown", "red"),
    (HW_THERMAL_SLOWDOWN.name, "HW thermal", "red"),
    (HW_POWER_BRAKE_SLOWDOWN.name, "HW power brake", "dark-red"),
)
# The reasons that limit nothing on a busy GPU (Effect.INFORMATIONAL), in the panels' order.
INFORMATIONAL_REASONS = "|".join(
    reason.name
    for reason in (GPU_IDLE, SYNC_BOOST, APPLICATIONS_CLOCKS_SETTING, DISPLAY_CLOCK_SETTING)
)


# Per-pod use (per-process attribution): the gpu_pod_* families carry their own namespace, pod
# and container in both attribution modes, so they are selected by the variables directly.
POD_VARIABLES = ('namespace=~"$namespace"', 'pod=~"$pod"')
POD_LEGEND = "{{namespace}}/{{pod}}/{{container}}"
BY_POD_DEVICE = "cluster, node, gpu, gpu_instance, mig_profile, namespace, pod, container"
ALLOCATED_BUT_IDLE = 'alertname="GpuAllocatedButIdle"'
PER_POD_NOTE = (
    "Per-pod use comes from the processes NVML lists, mapped to their containers (per-process "
    "attribution, kubernetes.processes); without it these panels stay empty (unknown, not 0)."
)


def _xid_list(xids: Iterable[int]) -> str:
    return ", ".join(str(xid) for xid in sorted(xids))


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def matches(label: str, pattern: str) -> str:
    return f'{label}=~"{pattern}"'


def sel(metric: str, *matchers: str) -> str:
    """`metric{...}` restricted to the cluster/node/gpu variables (and extra matchers)."""
    return f"{metric}{{{', '.join((GPU_MATCHERS, *matchers))}}}"


def scoped(expr: str) -> str:
    """Per-device `expr`, kept only for devices whose pod matches the namespace/pod variables."""
    return f"({expr}) and on ({DEVICE}) {IN_SCOPE}"


# Each device's size as a share of a full GPU, to weight averages and GPU-hours by: 1 for a
# whole GPU, its GPU instance's slices / 7 for a MIG instance, shared equally by the compute
# instances of a GPU instance split in several (as gpu:size:ratio in
# rules/gpu-exporter.recording.yaml, which these dashboards do not need); none for a MIG parent
# with instances.
_SLICES = f"max by (uuid, gpu_instance, mig_uuid) ({sel('gpu_mig_instance_slices')})"
SIZE = (
    f"({_SLICES} / on (uuid, gpu_instance) group_left () count by (uuid, gpu_instance) ({_SLICES})"
    f" / 7 or on (uuid) max by (uuid) ({sel('gpu_up')}) * 0 + 1)"
)
# What says a device is busy: NVML utilization on a whole GPU, graphics-engine activity on a
# MIG instance (NVML has no utilization under MIG; the classifier and the rules use the same).
MIG_INSTANCE = 'mig_uuid!=""'
BUSY = (
    f"({sel('gpu_utilization_ratio')} or {sel('gpu_graphics_engine_active_ratio', MIG_INSTANCE)})"
)


def sized(expr: str) -> str:
    """Per-device `expr` times the device's size, in full GPUs."""
    return f"({expr}) * on ({DEVICE}) group_left () {SIZE}"


def sized_mean(expr: str) -> str:
    """The mean of per-device `expr` over the devices that have it, weighted by their size."""
    return f"sum({sized(expr)}) / sum({sized(f'({expr}) * 0 + 1')})"


def over(function: str, selector: str, window: str) -> str:
    """`function(selector[window])`, e.g. over("rate", sel("x"), "$__rate_interval")."""
    return f"{function}({selector}[{window}])"


def per_gpu(expr: str, agg: str = "max", by: str = BY_GPU) -> str:
    """`expr` scoped and reduced to one series per GPU (drops pod labels in "labels" mode)."""
    return f"{agg} by ({by}) ({scoped(expr)})"


def per_device(expr: str, agg: str = "max") -> str:
    """`expr` scoped and reduced to one series per whole GPU or MIG instance."""
    return per_gpu(expr, agg, BY_DEVICE)


def zero_filled(expr: str, by: str) -> str:
    """`expr`, a `sum by (by)` of per-GPU series, or 0 for each in-scope group it lacks."""
    return f"{expr} or {per_gpu(sel('gpu_up'), by=by)} * 0"


def per_pod(selector_for: Callable[[str], str]) -> str:
    """Sum by namespace/pod of a per-device expression, charged to the pod holding the device
    and weighted by the device's size (a 1g MIG instance's hour is 1/7 of a GPU-hour).

    `selector_for(matchers)` builds the per-device expression with extra matchers. Series with
    pod labels ("labels" mode) keep them, which stays right for pods that ended within the
    range; the others are charged through UNLABELLED_OWNER.
    """
    unlabelled = selector_for('pod=""')
    labelled = selector_for('pod!="", namespace=~"$namespace", pod=~"$pod"')
    charged = (
        f"{UNLABELLED_OWNER} * on ({DEVICE}) group_left "
        f"sum by ({DEVICE}) ({unlabelled}) or {labelled}"
    )
    return f"sum by (cluster, namespace, pod) ({sized(charged)})"


def no_pod(expr: str) -> str:
    """Name the empty namespace (GPUs no pod holds) so a table row does not look blank."""
    return f'label_replace({expr}, "namespace", "(no pod)", "namespace", "")'


def class_code() -> str:
    """One series per device whose value is the code (1..8) of its current bottleneck class."""
    parts = " or ".join(
        f"{sel('gpu_bottleneck', eq('class', name))} * {code}"
        for code, (name, _, _) in enumerate(CLASSES, start=1)
    )
    return f"sum by ({BY_DEVICE}) ({scoped(parts)})"


def clock_event_now(*matchers: str) -> str:
    """1 while a clock-event reason holds, 0 while not, per GPU and reason: its state, or where
    the metrics profile `default` leaves the state out for the reason's time counter, whether
    that counter grew over the last rate interval."""
    grew = over("rate", sel("gpu_clock_event_seconds_total", *matchers), "$__rate_interval")
    return f"({sel('gpu_clock_event_active', *matchers)} or {grew} > bool 0)"


# The reasons NVML keeps a time counter of (gpu_clock_event_seconds_total).
COUNTED_REASONS = frozenset(r.name for r in CLOCK_EVENT_REASONS if r.counter_field is not None)


def slowdown_code() -> str:
    """One series per GPU: the code of the most severe slowdown reason active now (0: none)."""
    parts = " or ".join(
        (
            f"{clock_event_now(eq('reason', name))} * {code}"
            if name in COUNTED_REASONS
            else f"{sel('gpu_clock_event_active', eq('reason', name))} * {code}"
        )
        for code, (name, _, _) in enumerate(SLOWDOWN_REASONS, start=1)
    )
    return f"max by ({BY_GPU}) ({scoped(parts)})"


def xid_count(window: str) -> str:
    """XIDs per GPU and code over `window`: increase() of the counter, or the whole count of a
    counter born within the window. The default metrics profile exports an XID's counter from
    its first XID on, born at 1 with no earlier sample, where increase() alone sees nothing;
    the full profile's are born at 0 for the alerted XIDs."""
    counter = sel("gpu_xid_errors_total")
    return f"({counter} unless {counter} offset {window}) or {over('increase', counter, window)}"


def gpu_hours(recorded: str) -> str:
    """GPU-hours over the dashboard range from a recorded rate of GPU-seconds per second.

    The sum of the recorded samples times the rules' evaluation interval; the interval is the
    range divided by the samples cluster:gpu:count (same rule group) has in it.
    """
    interval = f"($__range_s / count_over_time(cluster:gpu:count{{{CLUSTER}}}[$__range]))"
    return f"sum_over_time({recorded}[$__range]) * on (cluster) group_left () {interval} / 3600"


def idle_alert_state(*matchers: str) -> str:
    """Per container and device: 2 while GpuAllocatedButIdle fires for it, 1 while pending."""
    firing = sel("ALERTS", ALLOCATED_BUT_IDLE, 'alertstate="firing"', *matchers)
    pending = sel("ALERTS", ALLOCATED_BUT_IDLE, 'alertstate="pending"', *matchers)
    return f"max by ({BY_POD_DEVICE}) ({firing} * 2 or {pending})"


# --- Grafana's model, through grafana-foundation-sdk ----------------------------------------------


@dataclass(frozen=True)
class Q:
    """One panel query."""

    expr: str
    legend: str = ""


def thresholds(base: str, *steps: tuple[float, str]) -> dashboard_sdk.ThresholdsConfig:
    return (
        dashboard_sdk.ThresholdsConfig()
        .mode(grafana.ThresholdsMode.ABSOLUTE)
        .steps(
            [grafana.Threshold(value=None, color=base)]
            + [grafana.Threshold(value=value, color=color) for value, color in steps]
        )
    )


NEUTRAL = thresholds("blue")
# NVIDIA's DCGM guidance: SM activity >= 0.8 is necessary for efficient use, < 0.5 likely
# means ineffective use.
SM_ACTIVITY = thresholds("red", (0.5, "orange"), (0.8, "green"))
ANY_IS_BAD = thresholds("green", (1, "red"))


def value_map(entries: Sequence[tuple[int | str, str, str]]) -> grafana.ValueMap:
    return grafana.ValueMap(
        options={
            str(value): grafana.ValueMappingResult(text=text, color=color, index=index)
            for index, (value, text, color) in enumerate(entries)
        }
    )


CLASS_MAP = value_map(
    [(0, "no class", "transparent")]
    + [(code, text, color) for code, (_, text, color) in enumerate(CLASSES, start=1)]
)
SLOWDOWN_MAP = value_map(
    [(0, "none", "green")]
    + [(code, text, color) for code, (_, text, color) in enumerate(SLOWDOWN_REASONS, start=1)]
)
UP_MAP = value_map([(1, "up", "green"), (0, "down", "red")])
# GpuAllocatedButIdle per container, as idle_alert_state() encodes it.
IDLE_STATE_MAP = value_map([(1, "pending", "orange"), (2, "firing", "red")])
OFF_ON_MAP = value_map([(0, "no", "green"), (1, "yes", "red")])

Override = cogbuilder.Builder[grafana.DashboardFieldConfigSourceOverrides]


def override(name: str, *properties: grafana.DynamicConfigValue, regexp: bool = False) -> Override:
    """Field override for the field named `name` (with `regexp`, the fields it matches)."""
    matcher = grafana.MatcherConfig(id_val="byRegexp" if regexp else "byName", options=name)
    return (
        dashboard_sdk.DashboardFieldConfigSourceOverrides()
        .matcher(matcher)
        .properties(list(properties))
    )


def field_unit(unit: str) -> grafana.DynamicConfigValue:
    return grafana.DynamicConfigValue(id_val="unit", value=unit)


def field_decimals(decimals: int) -> grafana.DynamicConfigValue:
    return grafana.DynamicConfigValue(id_val="decimals", value=decimals)


def field_mappings(*mappings: grafana.ValueMapping) -> grafana.DynamicConfigValue:
    return grafana.DynamicConfigValue(id_val="mappings", value=list(mappings))


def field_color(color: str) -> grafana.DynamicConfigValue:
    fixed = grafana.FieldColor(mode=grafana.FieldColorModeId.FIXED, fixed_color=color)
    return grafana.DynamicConfigValue(id_val="color", value=fixed)


DASHED = grafana.DynamicConfigValue(
    id_val="custom.lineStyle", value=common.LineStyle(fill="dash", dash=[10, 10])
)


def colored_cells(name: str, unit: str, thresholds_: dashboard_sdk.ThresholdsConfig) -> Override:
    background = common.TableColoredBackgroundCellOptions(
        mode=common.TableCellBackgroundDisplayMode.GRADIENT
    )
    return override(
        name,
        field_unit(unit),
        grafana.DynamicConfigValue(id_val="thresholds", value=thresholds_.build()),
        grafana.DynamicConfigValue(id_val="custom.cellOptions", value=background),
    )


Target = cogbuilder.Builder[cogvariants.Dataquery]


def _targets(queries: Sequence[Q], *, instant: bool, table: bool) -> list[Target]:
    targets: list[Target] = []
    for index, query in enumerate(queries):
        target = (
            prometheus_sdk.Dataquery()
            .datasource(DATASOURCE)
            .editor_mode(prometheus_model.QueryEditorMode.CODE)
            .expr(query.expr)
            .format(
                prometheus_model.PromQueryFormat.TABLE
                if table
                else prometheus_model.PromQueryFormat.TIME_SERIES
            )
            .legend_format(query.legend or "__auto")
            .ref_id(chr(ord("A") + index))
        )
        targets.append(target.instant() if instant else target.range())
    return targets


class PanelBuilder(Protocol):
    """What the builders of every panel kind have in common (each kind has its own class)."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: grafana.DataSourceRef) -> Self: ...
    def targets(self, targets: list[Target]) -> Self: ...
    def unit(self, unit: str) -> Self: ...
    def thresholds(self, thresholds: cogbuilder.Builder[grafana.ThresholdsConfig]) -> Self: ...
    def mappings(self, mappings: list[grafana.ValueMapping]) -> Self: ...
    def overrides(self, overrides: list[Override]) -> Self: ...
    def min(self, min_val: float) -> Self: ...
    def max(self, max_val: float) -> Self: ...
    def decimals(self, decimals: float) -> Self: ...
    def no_value(self, no_value: str) -> Self: ...
    def build(self) -> grafana.Panel: ...


def _panel(
    panel: PanelBuilder,
    title: str,
    description: str,
    targets: list[Target],
    *,
    unit: str,
    limits: tuple[float | None, float | None] = (None, None),
    thresholds_: dashboard_sdk.ThresholdsConfig = NEUTRAL,
    mappings: Sequence[grafana.ValueMapping] = (),
    overrides: Sequence[Override] = (),
    decimals: int | None = None,
    no_value: str | None = None,
) -> grafana.Panel:
    """What every panel has, set on the builder of its kind; the panel, built."""
    panel = (
        panel.title(title)
        .description(" ".join(description.split()))
        .datasource(DATASOURCE)
        .targets(targets)
        .unit(unit)
        .thresholds(thresholds_)
        .mappings(list(mappings))
        .overrides(list(overrides))
    )
    if limits[0] is not None:
        panel = panel.min(limits[0])
    if limits[1] is not None:
        panel = panel.max(limits[1])
    if decimals is not None:
        panel = panel.decimals(decimals)
    if no_value is not None:
        panel = panel.no_value(no_value)
    return panel.build()


BY_THRESHOLDS = dashboard_sdk.FieldColor().mode(grafana.FieldColorModeId.THRESHOLDS)


def _legend(
    *, show: bool = True, table: bool = False, calcs: Sequence[str] = ()
) -> common_sdk.VizLegendOptions:
    return (
        common_sdk.VizLegendOptions()
        .show_legend(show)
        .display_mode(common.LegendDisplayMode.TABLE if table else common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs(list(calcs))
    )


def _last_value() -> common_sdk.ReduceDataOptions:
    return common_sdk.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Q],
    *,
    unit: str,
    limits: tuple[float | None, float | None] = (None, None),
    thresholds_: dashboard_sdk.ThresholdsConfig = NEUTRAL,
    threshold_lines: bool = False,
    stack: bool = False,
    bars: bool = False,
    legend_calcs: Sequence[str] = ("mean", "max"),
    overrides: Sequence[Override] = (),
    decimals: int | None = None,
) -> grafana.Panel:
    panel = (
        timeseries_sdk.Panel()
        .color_scheme(dashboard_sdk.FieldColor().mode(grafana.FieldColorModeId.PALETTE_CLASSIC))
        .draw_style(common.GraphDrawStyle.BARS if bars else common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(30 if stack or bars else 10)
        .gradient_mode(common.GraphGradientMode.NONE)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .axis_soft_min(0)
        .stacking(
            common_sdk.StackingConfig()
            .mode(common.StackingMode.NORMAL if stack else common.StackingMode.NONE)
            .group("A")
        )
        .thresholds_style(
            common_sdk.GraphThresholdsStyleConfig().mode(
                common.GraphThresholdsStyleMode.DASHED
                if threshold_lines
                else common.GraphThresholdsStyleMode.OFF
            )
        )
        .legend(_legend(table=bool(legend_calcs), calcs=legend_calcs))
        .tooltip(
            common_sdk.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    return _panel(
        panel,
        title,
        description,
        _targets(queries, instant=False, table=False),
        unit=unit,
        limits=limits,
        thresholds_=thresholds_,
        overrides=overrides,
        decimals=decimals,
    )


def class_counts(description: str, expr: str) -> grafana.Panel:
    """Stacked GPU counts per bottleneck class, each class in its own fixed colour."""
    return timeseries(
        "GPUs per bottleneck class",
        description,
        [Q(expr, "{{class}}")],
        unit="short",
        stack=True,
        legend_calcs=("mean",),
        overrides=[override(name, field_color(color)) for name, _, color in CLASSES],
    )


def stat(
    title: str,
    description: str,
    query: Q,
    *,
    unit: str,
    thresholds_: dashboard_sdk.ThresholdsConfig = NEUTRAL,
    mappings: Sequence[grafana.ValueMapping] = (),
    decimals: int | None = None,
) -> grafana.Panel:
    panel = (
        stat_sdk.Panel()
        .color_scheme(BY_THRESHOLDS)
        .reduce_options(_last_value())
        .orientation(common.VizOrientation.AUTO)
        .text_mode(common.BigValueTextMode.AUTO)
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .justify_mode(common.BigValueJustifyMode.AUTO)
        .wide_layout(True)
        .show_percent_change(False)
        .percent_change_color_mode(common.PercentChangeColorMode.STANDARD)
    )
    return _panel(
        panel,
        title,
        description,
        _targets([query], instant=True, table=False),
        unit=unit,
        thresholds_=thresholds_,
        mappings=mappings,
        decimals=decimals,
    )


def bargauge(
    title: str,
    description: str,
    query: Q,
    *,
    unit: str,
    limits: tuple[float | None, float | None] = (0, None),
    thresholds_: dashboard_sdk.ThresholdsConfig = NEUTRAL,
    overrides: Sequence[Override] = (),
) -> grafana.Panel:
    panel = (
        bargauge_sdk.Panel()
        .color_scheme(BY_THRESHOLDS)
        .reduce_options(_last_value())
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .value_mode(common.BarGaugeValueMode.COLOR)
        .name_placement(common.BarGaugeNamePlacement.AUTO)
        .show_unfilled(True)
        .sizing(common.BarGaugeSizing.AUTO)
        .min_viz_width(8)
        .min_viz_height(16)
        .max_viz_height(300)
        .legend(_legend(show=False))
    )
    return _panel(
        panel,
        title,
        description,
        _targets([query], instant=True, table=False),
        unit=unit,
        limits=limits,
        thresholds_=thresholds_,
        overrides=overrides,
    )


def state_timeline(
    title: str,
    description: str,
    queries: Sequence[Q],
    *,
    mappings: Sequence[grafana.ValueMapping],
    overrides: Sequence[Override] = (),
) -> grafana.Panel:
    panel = (
        statetimeline_sdk.Panel()
        .color_scheme(BY_THRESHOLDS)
        .fill_opacity(80)
        .line_width(0)
        .merge_values(True)
        .show_value(common.VisibilityMode.AUTO)
        .align_value(common.TimelineValueAlignment.LEFT)
        .row_height(0.9)
        .legend(_legend(show=False))
        .tooltip(
            common_sdk.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.SINGLE)
            .sort(common.SortOrder.NONE)
        )
    )
    built = _panel(
        panel,
        title,
        description,
        _targets(queries, instant=False, table=False),
        unit="none",
        mappings=mappings,
        overrides=overrides,
    )
    # The SDK writes the schema's default page size (20); the panel itself has none, and a page
    # size turns pagination on: a timeline shows every GPU's row at once.
    assert isinstance(built.options, statetimeline_model.Options)
    built.options.per_page = None
    return built


def table(
    title: str,
    description: str,
    columns: Sequence[tuple[str, Q]],
    *,
    unit: str,
    thresholds_: dashboard_sdk.ThresholdsConfig = NEUTRAL,
    overrides: Sequence[Override] = (),
    hide: Iterable[str] = ("Time", "uuid"),
    sort_by: str | None = None,
    mappings: Sequence[grafana.ValueMapping] = (),
    no_value: str | None = None,
) -> grafana.Panel:
    """Instant queries, one value column each (named by `columns`), merged on their labels."""
    queries = [query for _, query in columns]
    if len(columns) == 1:
        rename = {"Value": columns[0][0]}
    else:
        rename = {f"Value #{chr(ord('A') + i)}": name for i, (name, _) in enumerate(columns)}
    panel = (
        table_sdk.Panel()
        .color_scheme(BY_THRESHOLDS)
        .align(common.FieldTextAlignment.AUTO)
        .cell_options(common.TableAutoCellOptions())
        .inspect(False)
        .show_header(True)
        .cell_height(common.TableCellHeight.SM)
        .frame_index(0)
        .transformations(
            [
                grafana.DataTransformerConfig(id_val="merge", options={}),
                grafana.DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": {name: True for name in hide},
                        "indexByName": {},
                        "renameByName": rename,
                    },
                ),
            ]
        )
    )
    if sort_by is not None:
        panel = panel.sort_by([common_sdk.TableSortByFieldState().display_name(sort_by).desc(True)])
    built = _panel(
        panel,
        title,
        description,
        _targets(queries, instant=True, table=True),
        unit=unit,
        thresholds_=thresholds_,
        mappings=mappings,
        overrides=overrides,
        no_value=no_value,
    )
    # Grafana 12 moved the footer into the field config, and @grafana/schema no longer has it
    # here; the SDK's default (no footer) is Grafana's.
    assert isinstance(built.options, table_model.Options)
    built.options.footer = None
    return built


# --- layout ----------------------------------------------------------------------------------


class Layout:
    """Places panels left to right on Grafana's 24-column grid and numbers them.

    The SDK's Dashboard.with_panel places too, but puts a panel that does not fit in what is
    left of a line past the grid's right edge; this starts a new line instead.
    """

    WIDTH = 24

    def __init__(self) -> None:
        self.panels: list[grafana.Panel | grafana.RowPanel] = []
        self._x = self._y = self._line_height = 0

    def _next_id(self) -> int:
        return len(self.panels) + 1

    def _new_line(self) -> None:
        self._y += self._line_height
        self._x = self._line_height = 0

    def row(self, title: str) -> None:
        self._new_line()
        grid = grafana.GridPos(h=1, w=self.WIDTH, x=0, y=self._y)
        self.panels.append(dashboard_sdk.Row(title).id(self._next_id()).grid_pos(grid).build())
        self._y += 1

    def add(self, panel: grafana.Panel, w: int, h: int = 8, *, repeat: str | None = None) -> None:
        """Place `panel`; with `repeat`, one copy per value of that variable, side by side."""
        if self._x + w > self.WIDTH:
            self._new_line()
        panel.id_val = self._next_id()
        panel.grid_pos = grafana.GridPos(h=h, w=w, x=self._x, y=self._y)
        if repeat is not None:
            panel.repeat, panel.repeat_direction = repeat, "h"
            panel.max_per_row = self.WIDTH // w
        self.panels.append(panel)
        self._x += w
        self._line_height = max(self._line_height, h)


# --- variables and the dashboard shell ------------------------------------------------------------

# Variables are built from the SDK's model, not its builders, which cannot unset a field: its one
# model for every kind of variable gives them all the interval variables' auto, auto_min and
# auto_count, which @grafana/schema's variables do not have.


def datasource_variable() -> grafana.VariableModel:
    return grafana.VariableModel(
        type_val=grafana.VariableType.DATASOURCE,
        name="datasource",
        label="Data source",
        query="prometheus",
        hide=grafana.VariableHide.DONT_HIDE,
        include_all=False,
        multi=False,
        options=[],
        refresh=grafana.VariableRefresh.ON_DASHBOARD_LOAD,
        regex="",
        auto=None,
        auto_min=None,
        auto_count=None,
    )


def query_variable(name: str, label: str, query: str, description: str) -> grafana.VariableModel:
    """Multi-value variable with an All value of `.*`, which also matches an absent label."""
    return grafana.VariableModel(
        type_val=grafana.VariableType.QUERY,
        name=name,
        label=label,
        description=description,
        datasource=DATASOURCE,
        query=query,
        current=grafana.VariableOption(text=["All"], value=["$__all"]),
        hide=grafana.VariableHide.DONT_HIDE,
        include_all=True,
        all_value=".*",
        multi=True,
        options=[],
        refresh=grafana.VariableRefresh.ON_TIME_RANGE_CHANGED,
        regex="",
        sort=grafana.VariableSort.NATURAL_ASC,
        auto=None,
        auto_min=None,
        auto_count=None,
    )


CLUSTER_VARIABLE = query_variable(
    "cluster",
    "Cluster",
    "label_values(gpu_up, cluster)",
    "Only where series carry a cluster label (a multi-cluster Prometheus); otherwise All.",
)
NODE_VARIABLE = query_variable(
    "node", "Node", 'label_values(gpu_up{cluster=~"$cluster"}, node)', "Kubernetes node."
)
NAMESPACE_VARIABLE = query_variable(
    "namespace",
    "Namespace",
    'label_values({__name__=~"gpu_pod_info|gpu_up", cluster=~"$cluster"}, namespace)',
    "Namespace of the pod holding the GPU (All includes GPUs no pod holds).",
)
POD_VARIABLE = query_variable(
    "pod",
    "Pod",
    'label_values({__name__=~"gpu_pod_info|gpu_up", cluster=~"$cluster", '
    'namespace=~"$namespace"}, pod)',
    "Pod holding the GPU.",
)
GPU_VARIABLE = query_variable(
    "gpu",
    "GPU",
    'label_values(gpu_up{cluster=~"$cluster", node=~"$node"}, gpu)',
    "NVML index of the GPU on its node.",
)
PER_GPU_VARIABLES = [
    datasource_variable(),
    CLUSTER_VARIABLE,
    NODE_VARIABLE,
    NAMESPACE_VARIABLE,
    POD_VARIABLE,
    GPU_VARIABLE,
]


def dashboard(
    uid: str, title: str, description: str, variables: list[grafana.VariableModel], layout: Layout
) -> grafana.Dashboard:
    board = (
        dashboard_sdk.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(grafana.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .fiscal_year_start_month(0)
        .week_start("")
        .live_now(False)
        .annotation(
            dashboard_sdk.AnnotationQuery()
            .built_in(1)
            .datasource(grafana.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .name("Annotations & Alerts")
            .type("dashboard")
        )
        .link(
            dashboard_sdk.DashboardLink("GPU dashboards")
            .type(grafana.DashboardLinkType.DASHBOARDS)
            .tags(["gpu-exporter"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
            .icon("external link")
            .target_blank(False)
            .tooltip("")
            .url("")
        )
        .build()
    )
    board.templating = grafana.DashboardDashboardTemplating(list_val=variables)
    board.panels = layout.panels  # placed by Layout, not by the builder's with_panel
    return board


# --- GPU efficiency --------------------------------------------------------------------------

ACTIVITY_NOTE = (
    "SM, Tensor and DRAM activity come from NVML GPM (Hopper and newer) or, before Hopper, "
    "from DCGM's profiling fields where the exporter has a DCGM host engine (dcgm.mode; "
    "gpu_activity_source_info says which), on a MIG instance from its GPU instance's either "
    "way. Without either they are absent, which means unknown, not idle, and their lines and "
    "cells stay empty."
)
CLASS_NOTE = (
    "Classes come from the exporter's classifier (ordered checks over a few seconds: idle, "
    "throttled, launch-bound, link-bound, memory-bound, tensor-bound, compute-bound, unknown; "
    'see the gpu-exporter README, "Is this GPU doing useful work?").'
)
MIG_WEIGHT_NOTE = "Each MIG instance weighs its share of a full GPU (1/7 for a 1g instance)."
MIG_NOTE = (
    "For a MIG instance, utilization is its graphics-engine activity (NVML has none under MIG); "
    "A100 and A30 instances have activity only from DCGM, else memory only. "
    f"{MIG_WEIGHT_NOTE}"
)
BUSY_BUT_IDLE_NOTE = (
    "Busy but idle = the launch-bound and link-bound classes: kernels run while most SMs have "
    "no work (tiny kernels, syncs, input stalls, waiting on transfers)."
)


def efficiency() -> grafana.Dashboard:
    def range_mean(metric: str) -> Q:
        return Q(per_device(over("avg_over_time", sel(metric), "$__range")))

    def class_seconds(classes: str) -> Callable[[str], str]:
        def selector(pod_matchers: str) -> str:
            matchers = (classes, pod_matchers) if classes else (pod_matchers,)
            mean = over("avg_over_time", sel("gpu_bottleneck", *matchers), "$__range")
            return f"{mean} * $__range_s"

        return selector

    # The time in a class is the average of its 0/1 state (gpu_bottleneck_seconds_total, the
    # exact count, is exported by the metrics profile `full` only).
    busy_but_idle_share = over("avg_over_time", sel("gpu_bottleneck", BUSY_BUT_IDLE), "$__range")
    board = Layout()
    board.row("Now")
    board.add(
        stat(
            "GPUs",
            "GPUs in scope of the variables, answering or not.",
            Q(f"count({scoped(sel('gpu_up'))})"),
            unit="short",
        ),
        w=3,
        h=4,
    )
    board.add(
        stat(
            "Mean utilization",
            "NVML utilization averaged over the GPUs in scope: the share of time any kernel ran. "
            "It says the GPU was busy, not that it did useful work: compare SM activity. "
            f"{MIG_NOTE}",
            Q(sized_mean(scoped(BUSY))),
            unit="percentunit",
            decimals=0,
        ),
        w=4,
        h=4,
    )
    board.add(
        stat(
            "Mean SM activity",
            "Share of cycles the SMs had work, averaged over the GPUs in scope that report it. "
            "NVIDIA's guidance: 80% or more is needed for efficient use; under 50% is likely "
            f"ineffective. {ACTIVITY_NOTE} {MIG_WEIGHT_NOTE}",
            Q(sized_mean(scoped(sel("gpu_sm_active_ratio")))),
            unit="percentunit",
            thresholds_=SM_ACTIVITY,
            decimals=0,
        ),
        w=4,
        h=4,
    )
    board.add(
        stat(
            "Mean Tensor activity",
            f"Share of cycles any Tensor Core pipe was active, averaged. {ACTIVITY_NOTE} "
            f"{MIG_WEIGHT_NOTE}",
            Q(sized_mean(scoped(sel("gpu_tensor_active_ratio")))),
            unit="percentunit",
            decimals=0,
        ),
        w=4,
        h=4,
    )
    board.add(
        stat(
            "Busy-but-idle GPUs",
            f"GPUs classified busy but idle now. {BUSY_BUT_IDLE_NOTE} Empty when the exporter "
            "does not classify (unknown), 0 when none is. In full GPUs: a MIG instance counts "
            "as its share of one (a 1g instance of 7 slices is 1/7).",
            Q(f"sum({sized(scoped(sel('gpu_bottleneck', BUSY_BUT_IDLE)))})"),
            unit="short",
            thresholds_=thresholds("green", (1, "orange")),
        ),
        w=4,
        h=4,
    )
    board.add(
        stat(
            "Firing alerts",
            "Alerts Prometheus is firing now for the GPUs in scope (and GPU-independent ones), "
            "from the shipped rule pack.",
            Q(
                'count(ALERTS{alertstate="firing", cluster=~"$cluster", node=~"$node", '
                'gpu=~"$gpu"}) or vector(0)'
            ),
            unit="short",
            thresholds_=ANY_IS_BAD,
        ),
        w=5,
        h=4,
    )

    board.row("Activity per GPU")
    board.add(
        timeseries(
            "GPU $gpu: utilization vs SM, Tensor and DRAM activity",
            "Utilization (dashed) only says a kernel was running. SM activity says how many SMs "
            "had work, Tensor activity how much of that used the Tensor Cores, DRAM activity "
            "how much memory bandwidth was used. High utilization with low SM activity is "
            f"busy-but-idle. One panel per GPU index; pick a node to see one GPU per panel. A GPU "
            "with MIG shows a line set per instance (its profile and GPU-instance id in the "
            f"legend). {ACTIVITY_NOTE} {MIG_NOTE}",
            [
                Q(scoped(BUSY), f"{INSTANCE_LEGEND} utilization"),
                Q(scoped(sel("gpu_sm_active_ratio")), f"{INSTANCE_LEGEND} SM active"),
                Q(scoped(sel("gpu_tensor_active_ratio")), f"{INSTANCE_LEGEND} Tensor active"),
                Q(scoped(sel("gpu_dram_active_ratio")), f"{INSTANCE_LEGEND} DRAM active"),
            ],
            unit="percentunit",
            limits=(0, 1),
            legend_calcs=("mean",),
            overrides=[
                override(".*utilization", DASHED, regexp=True),
            ],
        ),
        w=6,
        h=8,
        repeat="gpu",
    )
    board.add(
        table(
            "Efficiency per GPU (averages over the range)",
            "Per GPU, and per MIG instance (profile and GPU-instance id in their columns): mean "
            "utilization and SM/Tensor/DRAM activity over the dashboard range, the share of that "
            "time it was busy but idle, and its bottleneck class now. "
            f"{BUSY_BUT_IDLE_NOTE} {ACTIVITY_NOTE} {MIG_NOTE}",
            [
                (
                    "Utilization",
                    Q(
                        per_device(
                            f"{over('avg_over_time', sel('gpu_utilization_ratio'), '$__range')}"
                            " or "
                            + over(
                                "avg_over_time",
                                sel("gpu_graphics_engine_active_ratio", MIG_INSTANCE),
                                "$__range",
                            )
                        )
                    ),
                ),
                ("SM active", range_mean("gpu_sm_active_ratio")),
                ("Tensor active", range_mean("gpu_tensor_active_ratio")),
                ("DRAM active", range_mean("gpu_dram_active_ratio")),
                ("Busy but idle", Q(per_device(busy_but_idle_share, "sum"))),
                ("Class now", Q(class_code())),
            ],
            unit="percentunit",
            overrides=[
                colored_cells("SM active", "percentunit", SM_ACTIVITY),
                colored_cells(
                    "Busy but idle",
                    "percentunit",
                    thresholds("green", (0.1, "orange"), (0.5, "red")),
                ),
                override("Class now", field_unit("none"), field_mappings(CLASS_MAP)),
            ],
            hide=("Time", "uuid", "mig_uuid"),
            sort_by="Busy but idle",
        ),
        w=24,
        h=9,
    )

    board.row("Bottleneck classes")
    board.add(
        state_timeline(
            "Bottleneck class per GPU",
            f"What limits each GPU, over time. {CLASS_NOTE} 'unknown' means the activity data "
            "needed to judge is absent or stuck; a GPU that is down has no class.",
            [Q(class_code(), DEVICE_LEGEND)],
            mappings=[CLASS_MAP],
        ),
        w=24,
        h=9,
    )
    board.add(
        class_counts(
            f"How many GPUs in scope are in each class, over time, in full GPUs (a MIG instance "
            f"counts as its share of one). {CLASS_NOTE}",
            f"sum by (class) ({sized(scoped(sel('gpu_bottleneck')))})",
        ),
        w=12,
        h=8,
    )
    seconds = sized(scoped(over("avg_over_time", sel("gpu_bottleneck"), "$__range")))
    board.add(
        bargauge(
            "Share of GPU time by class (range)",
            "Share of the GPU time in scope spent in each class over the dashboard range, from "
            "gpu_bottleneck averaged over it, each device weighted by its size; a class never "
            f"seen shows 0. {CLASS_NOTE}",
            Q(
                f"sort_desc(sum by (class) ({seconds}) / ignoring (class) group_left "
                f"sum({seconds}))",
                "{{class}}",
            ),
            unit="percentunit",
            limits=(0, 1),
        ),
        w=12,
        h=8,
    )

    observed = per_pod(class_seconds(""))
    busy_but_idle = per_pod(class_seconds(BUSY_BUT_IDLE))
    board.add(
        table(
            "Busy-but-idle GPU-hours by namespace and pod (range)",
            "GPU-hours over the dashboard range per pod holding the GPUs: observed, busy but "
            f"idle, and idle. {BUSY_BUT_IDLE_NOTE} '(no pod)' is time of GPUs no pod held. With "
            "pod attribution in 'info' mode a GPU's time is charged to the pod holding it now; "
            "in 'labels' mode to the pod that held it then. A GPU shared by several pods is "
            "charged to each. A MIG instance's hour counts as its share of a GPU-hour (1/7 for "
            "a 1g instance of 7 slices).",
            [
                ("GPU-hours", Q(no_pod(f"{observed} / 3600"))),
                ("Busy-but-idle GPU-hours", Q(no_pod(f"{busy_but_idle} / 3600"))),
                (
                    "Idle GPU-hours",
                    Q(no_pod(f"{per_pod(class_seconds(eq('class', 'idle')))} / 3600")),
                ),
                ("Busy-but-idle share", Q(no_pod(f"{busy_but_idle} / {observed}"))),
            ],
            unit="h",
            hide=("Time",),
            overrides=[
                colored_cells(
                    "Busy-but-idle share",
                    "percentunit",
                    thresholds("green", (0.1, "orange"), (0.5, "red")),
                )
            ],
            sort_by="Busy-but-idle GPU-hours",
        ),
        w=24,
        h=8,
    )

    board.row("Inside the SMs and memory")
    board.add(
        timeseries(
            "SM occupancy",
            "Resident warps as a share of the theoretical maximum: low occupancy with high SM "
            f"activity points at register or shared-memory limits. {ACTIVITY_NOTE}",
            [Q(scoped(sel("gpu_sm_occupancy_ratio")), DEVICE_LEGEND)],
            unit="percentunit",
            limits=(0, 1),
            legend_calcs=("mean",),
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "Device memory used and reserved",
            "Memory allocated by processes (used) and held by the driver and firmware "
            "(reserved), per GPU and MIG instance. A framework's caching allocator keeps memory "
            "it freed, so 'used' is an upper bound of what the model needs. Reserved needs "
            "memory info v2 (newer drivers).",
            [
                Q(scoped(sel("gpu_memory_used_bytes")), DEVICE_LEGEND + " used"),
                Q(scoped(sel("gpu_memory_reserved_bytes")), DEVICE_LEGEND + " reserved"),
            ],
            unit="bytes",
            legend_calcs=("max",),
            overrides=[override(".* reserved", DASHED, regexp=True)],
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "Device memory used (share of total)",
            "Used memory over total per GPU and MIG instance. Near 100% the next allocation "
            "fails (CUDA out of memory) or the framework starts evicting its cache.",
            [
                Q(
                    f"({scoped(sel('gpu_memory_used_bytes'))}) / {sel('gpu_memory_total_bytes')}",
                    DEVICE_LEGEND,
                )
            ],
            unit="percentunit",
            limits=(0, 1),
            thresholds_=thresholds("green", (0.9, "orange"), (0.97, "red")),
            threshold_lines=True,
            legend_calcs=("max",),
        ),
        w=12,
        h=8,
    )

    board.row("Workloads: use per pod")
    board.add(
        timeseries(
            "Utilization share per pod",
            "Share of each sample period the container's kernels ran on the GPU: its part of the "
            "GPU's utilization when several pods share it (time-slicing, MPS), the GPU's own when "
            "it is alone. Summed from NVML's per-process samples and never more than the GPU's "
            f"utilization. NVML has none under MIG. {PER_POD_NOTE}",
            [Q(sel("gpu_pod_utilization_ratio", *POD_VARIABLES), f"{GPU_LEGEND} {POD_LEGEND}")],
            unit="percentunit",
            limits=(0, 1),
        ),
        w=8,
        h=8,
    )
    board.add(
        timeseries(
            "GPU memory per pod",
            "GPU memory the container's processes use, per GPU and MIG instance (NVML's "
            "per-process figures; a framework's caching allocator keeps what it freed). "
            f"{PER_POD_NOTE}",
            [Q(sel("gpu_pod_memory_used_bytes", *POD_VARIABLES), f"{DEVICE_LEGEND} {POD_LEGEND}")],
            unit="bytes",
            legend_calcs=("max",),
        ),
        w=8,
        h=8,
    )
    pod_power = over("rate", sel("gpu_pod_energy_joules_total", *POD_VARIABLES), "$__rate_interval")
    board.add(
        timeseries(
            "GPU power charged per pod",
            "The GPU's power charged to each container: all of it while the container runs "
            "alone on the GPU (exclusive, measured: solid), else the GPU's energy by its share "
            "of the SM time its processes used (apportioned, an estimate: dashed). NVML "
            f"measures no per-process energy, and none per MIG instance. {PER_POD_NOTE}",
            [
                Q(
                    f"sum by (cluster, node, gpu, namespace, pod, container, attribution) "
                    f"({pod_power})",
                    f"{GPU_LEGEND} {POD_LEGEND} {{{{attribution}}}}",
                )
            ],
            unit="watt",
            overrides=[override(".* apportioned", DASHED, regexp=True)],
        ),
        w=8,
        h=8,
    )
    board.add(
        table(
            "Idle allocations now",
            "Containers holding a GPU, MIG instance or share of one and doing nothing with it: "
            "the shipped GpuAllocatedButIdle alert (pending, or firing after 30 minutes: a "
            "device the classifier calls idle while a pod holds it, no per-process data needed) "
            "and, with per-process attribution, the containers whose utilization share is 0 "
            "now (their processes ran no kernel) or that run no process on the device now. "
            f"{PER_POD_NOTE}",
            [
                ("GpuAllocatedButIdle", Q(idle_alert_state(*POD_VARIABLES))),
                (
                    "Utilization share",
                    Q(
                        f"max by ({BY_POD_DEVICE}) "
                        f"({sel('gpu_pod_utilization_ratio', *POD_VARIABLES)} == 0)"
                    ),
                ),
                (
                    "Processes",
                    Q(
                        f"max by ({BY_POD_DEVICE}) "
                        f"({sel('gpu_pod_processes', *POD_VARIABLES)} == 0)"
                    ),
                ),
            ],
            unit="short",
            overrides=[
                override("GpuAllocatedButIdle", field_unit("none"), field_mappings(IDLE_STATE_MAP)),
                override("Utilization share", field_unit("percentunit")),
            ],
            hide=("Time",),
            sort_by="GpuAllocatedButIdle",
            no_value="No idle allocations",
        ),
        w=24,
        h=8,
    )

    board.row("Alerts")
    board.add(
        table(
            "Alerts firing and pending",
            "Prometheus' ALERTS for the GPUs in scope: the shipped rule pack's efficiency, "
            "throttling and health alerts, pending ones included (they fire once their `for` "
            "has passed). Each alert's runbook_url opens its section of the runbook (the exporter "
            "serves it at /runbook). Empty when nothing is wrong.",
            [
                (
                    "Active",
                    Q(
                        'ALERTS{cluster=~"$cluster", node=~"$node", gpu=~"$gpu", '
                        'namespace=~"$namespace", pod=~"$pod"}'
                    ),
                )
            ],
            unit="short",
            hide=("Time", "__name__", "Active"),
            no_value="No alerts",
        ),
        w=24,
        h=8,
    )
    return dashboard(
        "gpu-exporter-efficiency",
        "GPU efficiency",
        "Is each GPU doing useful work, and if not, why: utilization against SM, Tensor and DRAM "
        "activity, bottleneck classes, busy-but-idle GPU-hours by pod. gpu-exporter.",
        PER_GPU_VARIABLES,
        board,
    )


# --- GPU health & throttling -----------------------------------------------------------------


def health() -> grafana.Dashboard:
    def throttle_rate(window: str) -> str:
        return over("rate", sel("gpu_clock_event_seconds_total"), window)

    sm_and_memory = matches("clock", "sm|memory")
    energy = over("increase", sel("gpu_energy_joules_total"), "$__range")
    nvlink_rate = over("rate", sel("gpu_nvlink_bytes_total"), "$__rate_interval")
    uncorrected = eq("error", "uncorrected")
    ecc_increase = over("increase", sel("gpu_ecc_errors_total"), "$__rate_interval")
    board = Layout()
    board.row("Throttling")
    board.add(
        state_timeline(
            "Worst clock-event reason per GPU",
            "The most severe reason holding each GPU's clocks down, over time: SW power cap "
            "(at the power limit, normal under load) < SW thermal < HW slowdown < HW thermal < "
            "HW power brake. 'none' when no such reason is active; empty for a GPU that reports "
            "no clock-event reasons.",
            [Q(slowdown_code(), GPU_LEGEND)],
            mappings=[SLOWDOWN_MAP],
        ),
        w=24,
        h=9,
    )
    board.add(
        state_timeline(
            "Clock-event reasons, each GPU and reason",
            "Every clock-event reason the driver reports, per GPU: red while a reason that "
            "slows the GPU holds, blue for informational ones (GPU idle, sync boost, "
            "application/display clock settings: with the metrics profile full only). Pick a "
            "GPU to keep this readable.",
            [Q(scoped(clock_event_now()), GPU_LEGEND + " {{reason}}")],
            mappings=[value_map([(0, "off", "transparent"), (1, "active", "red")])],
            overrides=[
                override(
                    f".*({INFORMATIONAL_REASONS})",
                    field_mappings(value_map([(0, "off", "transparent"), (1, "active", "blue")])),
                    regexp=True,
                )
            ],
        ),
        w=24,
        h=10,
    )
    board.add(
        timeseries(
            "Throttle time share by reason",
            "Share of time each reason held the clocks down (rate of "
            "gpu_clock_event_seconds_total), per GPU; 0 when it did not. HW slowdown has no "
            "time counter in NVML: see the state timelines. The shipped alerts fire at 5% "
            "(HW thermal) and 25% (SW thermal).",
            [
                Q(
                    "sum by (cluster, node, gpu, reason) "
                    f"({scoped(throttle_rate('$__rate_interval'))})",
                    GPU_LEGEND + " {{reason}}",
                )
            ],
            unit="percentunit",
            limits=(0, 1),
            thresholds_=thresholds("green", (0.05, "orange"), (0.25, "red")),
            threshold_lines=True,
        ),
        w=12,
        h=8,
    )
    board.add(
        bargauge(
            "Most throttled GPUs and reasons (range)",
            "The ten GPU/reason pairs with the largest share of the dashboard range spent "
            "throttled; 0 when none was.",
            Q(
                "topk(10, sum by (cluster, node, gpu, reason) "
                f"({scoped(throttle_rate('$__range'))}))",
                GPU_LEGEND + " {{reason}}",
            ),
            unit="percentunit",
            limits=(0, 1),
            thresholds_=thresholds("green", (0.05, "orange"), (0.25, "red")),
        ),
        w=12,
        h=8,
    )

    board.row("Clocks, power, temperature")
    board.add(
        timeseries(
            "Clocks as a share of their maximum",
            "Current SM and memory clock over the maximum the GPU supports. Busy GPUs below "
            "60% of the max SM clock are throttled (GpuClocksLowWhileBusy); idle GPUs park "
            "their clocks low on purpose.",
            [
                Q(
                    scoped(
                        f"{sel('gpu_clock_hertz', sm_and_memory)} / "
                        f"{sel('gpu_clock_max_hertz', sm_and_memory)}"
                    ),
                    GPU_LEGEND + " {{clock}}",
                )
            ],
            unit="percentunit",
            limits=(0, 1),
            thresholds_=thresholds("red", (0.6, "green")),
            threshold_lines=True,
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "SM clock and its maximum",
            "Current SM clock per GPU (solid) and the maximum it supports (dashed).",
            [
                Q(scoped(sel("gpu_clock_hertz", eq("clock", "sm"))), GPU_LEGEND),
                Q(scoped(sel("gpu_clock_max_hertz", eq("clock", "sm"))), GPU_LEGEND + " max"),
            ],
            unit="hertz",
            legend_calcs=("mean", "min"),
            overrides=[override(".* max", DASHED, regexp=True)],
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "Power draw and limit",
            "Power draw per GPU (1 s average on Ampere and newer) and its enforced limit "
            "(dashed), after every limiter (application, default, host).",
            [
                Q(scoped(sel("gpu_power_watts")), GPU_LEGEND),
                Q(scoped(sel("gpu_power_limit_watts")), GPU_LEGEND + " limit"),
            ],
            unit="watt",
            overrides=[override(".* limit", DASHED, regexp=True)],
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "Power as a share of the limit",
            "Draw over enforced limit. At 95% or more the GPU is power-capped: clocks drop to "
            "stay under the limit (SW power cap), which costs throughput on compute-bound work.",
            [Q(scoped(f"{sel('gpu_power_watts')} / {sel('gpu_power_limit_watts')}"), GPU_LEGEND)],
            unit="percentunit",
            limits=(0, 1),
            thresholds_=thresholds("green", (0.95, "orange")),
            threshold_lines=True,
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "Temperatures",
            "GPU die and memory (HBM) temperature per GPU. Hopper starts slowing down in the "
            "upper 80s °C (die) and 95 °C (HBM); the exact limits are per SKU.",
            [Q(scoped(sel("gpu_temperature_celsius")), GPU_LEGEND + " {{sensor}}")],
            unit="celsius",
            thresholds_=thresholds("green", (85, "orange"), (90, "red")),
            threshold_lines=True,
            legend_calcs=("mean", "max"),
        ),
        w=12,
        h=8,
    )
    board.add(
        bargauge(
            "Energy per GPU (range)",
            "Energy each GPU used over the dashboard range, from the driver's energy counter "
            "(Volta and newer).",
            Q(
                f"sort_desc(sum by (cluster, node, gpu) ({scoped(energy)}) / 3.6e6)",
                GPU_LEGEND,
            ),
            unit="kwatth",
        ),
        w=8,
        h=8,
    )
    board.add(
        stat(
            "Energy, all GPUs in scope (range)",
            "Total energy the GPUs in scope used over the dashboard range.",
            Q(f"sum({scoped(energy)}) / 3.6e6"),
            unit="kwatth",
            decimals=2,
        ),
        w=4,
        h=8,
    )

    board.row("Links and topology")
    pcie_rate = (
        f"{over('rate', sel('gpu_pcie_bytes_total'), '$__rate_interval')} "
        f"or on (uuid, direction) {sel('gpu_pcie_throughput_bytes_per_second')}"
    )
    board.add(
        timeseries(
            "PCIe throughput",
            "Bytes per second over PCIe per GPU and direction, from the byte counters; on "
            "older drivers from the 20 ms throughput sample instead. Host-to-device copies and "
            "data loading show up here.",
            [
                Q(
                    f"sum by (cluster, node, gpu, direction) ({scoped(pcie_rate)})",
                    GPU_LEGEND + " {{direction}}",
                )
            ],
            unit="Bps",
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "NVLink throughput",
            "Bytes per second over all NVLink links per GPU and direction. Empty for GPUs "
            "without NVLink.",
            [
                Q(
                    f"sum by (cluster, node, gpu, direction) ({scoped(nvlink_rate)})",
                    GPU_LEGEND + " {{direction}}",
                )
            ],
            unit="Bps",
        ),
        w=12,
        h=8,
    )

    def link(metric: str, state: str) -> Q:
        return Q(per_gpu(sel(metric, eq("state", state))))

    width_degraded = (
        f"{sel('gpu_pcie_link_width', eq('state', 'current'))} < bool ignoring (state) "
        f"{sel('gpu_pcie_link_width', eq('state', 'max'))}"
    )
    board.add(
        table(
            "Link state per GPU",
            "PCIe generation and width now and at most, whether the width trained below its "
            "maximum (a seating, riser or retimer problem; a lower generation is normal on an "
            "idle GPU, which saves power), PCIe replays over the range (link-level "
            "retransmissions), active NVLink links (empty without NVLink) and the host NUMA "
            "node nearest the GPU.",
            [
                ("PCIe gen", link("gpu_pcie_link_generation", "current")),
                ("PCIe gen max", link("gpu_pcie_link_generation", "max")),
                ("Width", link("gpu_pcie_link_width", "current")),
                ("Width max", link("gpu_pcie_link_width", "max")),
                ("Width degraded", Q(per_gpu(width_degraded))),
                (
                    "PCIe replays",
                    Q(per_gpu(over("increase", sel("gpu_pcie_replay_total"), "$__range"))),
                ),
                ("NVLink links", Q(per_gpu(sel("gpu_nvlink_links_active")))),
                ("NUMA node", Q(per_gpu(sel("gpu_numa_node")))),
            ],
            unit="none",
            overrides=[
                override("Width degraded", field_mappings(OFF_ON_MAP)),
                colored_cells(
                    "PCIe replays", "short", thresholds("green", (1, "orange"), (100, "red"))
                ),
            ],
        ),
        w=24,
        h=8,
    )
    board.add(
        table(
            "Topology: how each GPU reaches most of its peers",
            "The link type between each GPU and most of its peers, as nvidia-smi topo -m shows "
            "it: nvlink, single or multiple PCIe switches, host bridge, same NUMA node, across "
            "sockets. Collective communication is fastest over NVLink. The peers reached "
            "otherwise are in the next table.",
            [
                (
                    "Link",
                    Q(per_gpu(sel("gpu_topology_usual_link_info"), by=f"{BY_GPU}, link")),
                )
            ],
            unit="none",
            hide=("Time", "uuid", "Link"),
        ),
        w=12,
        h=8,
    )
    board.add(
        table(
            "Topology: peers reached otherwise",
            "Pairs of GPUs whose link differs from the first GPU's usual one (e.g. a pair across "
            "sockets on a PCIe board, or unknown). Empty on a uniform NVLink/NVSwitch board.",
            [("Link", Q(per_gpu(sel("gpu_topology_link_info"), by=f"{BY_GPU}, peer_gpu, link")))],
            unit="none",
            hide=("Time", "uuid", "Link"),
        ),
        w=12,
        h=8,
    )

    board.row("Errors")
    xid = scoped(xid_count("$__rate_interval"))
    board.add(
        timeseries(
            "XID errors",
            "XID errors per GPU (NVML events; the exporter sees only XIDs after it started). 0 "
            f"when none happened. Critical XIDs ({_xid_list(CRITICAL_XIDS)}) raise "
            f"GpuXidCritical, {_xid_list(WARNING_XIDS)} GpuXidWarning (the exporter's "
            "/runbook says what to do).",
            [
                Q(
                    zero_filled(f"sum by (cluster, node, gpu) ({xid})", "cluster, node, gpu"),
                    GPU_LEGEND,
                )
            ],
            unit="short",
            bars=True,
            legend_calcs=("sum",),
        ),
        w=12,
        h=8,
    )
    board.add(
        table(
            "XID errors by code (range)",
            "Each XID code per GPU over the dashboard range and when it last happened. Lists "
            "only XIDs that happened; empty when there were none.",
            [
                (
                    "Count",
                    # > 0: in the full profile the alerted XIDs' counters exist at 0 before the
                    # first one.
                    Q(f"sum by (cluster, node, gpu, xid) ({scoped(xid_count('$__range'))}) > 0"),
                ),
                (
                    "Last seen",
                    Q(
                        "max by (cluster, node, gpu, xid) "
                        f"({scoped(sel('gpu_xid_last_timestamp_seconds'))}) * 1000"
                    ),
                ),
            ],
            unit="short",
            overrides=[override("Last seen", field_unit("dateTimeAsIso"))],
            no_value="No XID errors",
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "ECC errors",
            "Corrected and uncorrected ECC errors per GPU (volatile counters, since the driver "
            "loaded). Empty where ECC is off or not supported: unknown, not zero. Any "
            "uncorrected error raises GpuUncorrectableEccErrors.",
            [
                Q(
                    f"sum by (cluster, node, gpu, error) ({scoped(ecc_increase)})",
                    GPU_LEGEND + " {{error}}",
                )
            ],
            unit="short",
            bars=True,
            legend_calcs=("sum",),
        ),
        w=12,
        h=8,
    )
    memory_flags = (
        f"{sel('gpu_row_remap_pending')} or {sel('gpu_row_remap_failure')} or "
        f"{sel('gpu_retired_pages_pending')}"
    )
    board.add(
        stat(
            "GPUs needing a reset or service",
            "GPUs with a row remap or page retirement pending (reset or reboot needed) or a "
            "failed row remap (service needed). Empty where the GPU reports none of these.",
            Q(
                f"count(max by (uuid) ({scoped(memory_flags)}) == 1) or on () "
                f"0 * count({scoped(memory_flags)})"
            ),
            unit="short",
            thresholds_=ANY_IS_BAD,
        ),
        w=4,
        h=8,
    )
    board.add(
        table(
            "Memory health per GPU",
            "ECC mode, uncorrected ECC errors over the range, remapped rows (Ampere and newer) "
            "and retired pages (older GPUs), and whether a reset is pending or a remap failed. "
            "Cells stay empty where the GPU does not report the quantity, and with the default "
            "metrics profile the remapped rows and retired pages until a GPU's first one.",
            [
                ("ECC on", Q(per_gpu(sel("gpu_ecc_enabled")))),
                (
                    "Uncorrected ECC",
                    Q(
                        per_gpu(
                            over("increase", sel("gpu_ecc_errors_total", uncorrected), "$__range")
                        )
                    ),
                ),
                ("Remapped rows", Q(per_gpu(sel("gpu_remapped_rows_total"), "sum"))),
                ("Remap pending", Q(per_gpu(sel("gpu_row_remap_pending")))),
                ("Remap failed", Q(per_gpu(sel("gpu_row_remap_failure")))),
                ("Retired pages", Q(per_gpu(sel("gpu_retired_pages_total"), "sum"))),
                ("Retirement pending", Q(per_gpu(sel("gpu_retired_pages_pending")))),
            ],
            unit="short",
            overrides=[
                override(
                    "ECC on", field_mappings(value_map([(1, "on", "green"), (0, "off", "orange")]))
                ),
                colored_cells("Uncorrected ECC", "short", ANY_IS_BAD),
                *(
                    override(name, field_mappings(OFF_ON_MAP))
                    for name in ("Remap pending", "Remap failed", "Retirement pending")
                ),
            ],
        ),
        w=20,
        h=8,
    )

    board.row("Exporter")
    board.add(
        state_timeline(
            "GPU answering",
            "Whether each GPU answered NVML in the exporter's tick: down when lost "
            "(GPU_IS_LOST, fallen off the bus) or hung past the deadline.",
            [Q(scoped(sel("gpu_up")), GPU_LEGEND)],
            mappings=[UP_MAP],
        ),
        w=24,
        h=7,
    )
    exporter = 'cluster=~"$cluster", node=~"$node"'
    board.add(
        stat(
            "Seconds since the last sample",
            "Age of each exporter's latest sample, per node. More than a few sampling "
            "intervals means the sampler is stuck (GpuExporterNotSampling).",
            Q(
                "time() - max by (cluster, node) "
                f"(gpu_exporter_last_tick_timestamp_seconds{{{exporter}}})"
            ),
            unit="s",
            thresholds_=thresholds("green", (5, "orange"), (30, "red")),
            decimals=1,
        ),
        w=6,
        h=7,
    )
    board.add(
        timeseries(
            "Sampler tick duration",
            "How long one sampling tick (every GPU read concurrently) takes, 50th and 99th "
            "percentile per node. Near the sampling interval, ticks are skipped.",
            [
                Q(
                    f"histogram_quantile({q}, sum by (cluster, node, le) "
                    f"(rate(gpu_exporter_tick_duration_seconds_bucket{{{exporter}}}"
                    "[$__rate_interval])))",
                    "{{node}} p" + label,
                )
                for q, label in (("0.5", "50"), ("0.99", "99"))
            ],
            unit="s",
            thresholds_=thresholds("green", (0.8, "orange")),
            threshold_lines=True,
        ),
        w=9,
        h=7,
    )
    board.add(
        timeseries(
            "Read errors",
            "Failed NVML reads per second by source, field and error (Timeout, GpuIsLost, "
            "NoPermission, ...). Unsupported fields are learned once and not counted again. 0 "
            "when there are none.",
            [
                Q(
                    "sum by (cluster, node, source, field, error) "
                    f"(rate(gpu_exporter_errors_total{{{exporter}}}[$__rate_interval])) "
                    'or on () label_replace(vector(0), "error", "none", "", "")',
                    "{{node}} {{source}} {{field}} {{error}}",
                )
            ],
            unit="cps",
        ),
        w=9,
        h=7,
    )
    notification_series = (
        ("sent", "gpu_exporter_notifications_sent_total"),
        ("failed", "gpu_exporter_notifications_errors_total"),
        ("rejected", "gpu_exporter_notifications_rejected_total"),
        ("dropped", "gpu_exporter_notifications_dropped_total"),
    )
    board.add(
        timeseries(
            "Alert notifications from the daemon",
            "Alerts the daemon's own rule evaluation delivered to Alertmanager per second: "
            "sent, failed (retried), rejected (4xx) and dropped (queue full). 0 when the "
            "daemon sends nothing.",
            [
                Q(
                    f"sum by (cluster, node) (rate({metric}{{{exporter}}}[$__rate_interval])) "
                    f'or on () label_replace(vector(0), "node", "all", "", "")',
                    "{{node}} " + name,
                )
                for name, metric in notification_series
            ],
            unit="cps",
            overrides=[override(".* (dropped|rejected)", field_color("red"), regexp=True)],
        ),
        w=12,
        h=7,
    )
    board.add(
        stat(
            "In-daemon alerts firing",
            "Alerts the daemon's own rule evaluation fires now, over all exporters in scope.",
            Q(f'sum(gpu_exporter_alerts{{{exporter}, state="firing"}}) or vector(0)'),
            unit="short",
            thresholds_=ANY_IS_BAD,
        ),
        w=4,
        h=7,
    )
    board.add(
        stat(
            "Pod attribution",
            "Whether each exporter's last kubelet PodResources refresh succeeded. Down means no "
            "pod labels until the kubelet answers again; metrics keep flowing. Empty where "
            "attribution is not enabled.",
            Q(f"min by (cluster, node) (gpu_exporter_attribution_up{{{exporter}}})"),
            unit="none",
            mappings=[value_map([(1, "OK", "green"), (0, "failing", "red")])],
        ),
        w=4,
        h=7,
    )
    board.add(
        stat(
            "Rule evaluation failures (range)",
            "Rule evaluations in the daemon that failed over the range (the rule keeps its last "
            "good state).",
            Q(
                "sum(increase(gpu_exporter_rule_evaluation_failures_total"
                f"{{{exporter}}}[$__range])) or vector(0)"
            ),
            unit="short",
            thresholds_=ANY_IS_BAD,
            decimals=0,
        ),
        w=4,
        h=7,
    )
    board.add(
        table(
            "GPU inventory",
            "Model, architecture, compute capability, PCI bus id and driver of every GPU in "
            "scope, and the exporter build per node.",
            [("GPUs", Q(scoped(sel("gpu_info"))))],
            unit="none",
            hide=("Time", "GPUs", "__name__"),
        ),
        w=24,
        h=8,
    )
    return dashboard(
        "gpu-exporter-health",
        "GPU health & throttling",
        "What slows the GPUs down and what is failing: clock-event (throttle) reasons and time, "
        "clocks, power, temperature, PCIe/NVLink, XID/ECC/row remapping, exporter health. "
        "gpu-exporter.",
        PER_GPU_VARIABLES,
        board,
    )


# --- Fleet -----------------------------------------------------------------------------------


def fleet() -> grafana.Dashboard:
    in_cluster = f"{{{CLUSTER}}}"
    in_namespace = f'{{{CLUSTER}, namespace=~"$namespace"}}'
    in_node = f'{{{CLUSTER}, node=~"$node"}}'
    held = f'{{{CLUSTER}, namespace!=""}}'  # GPUs some pod holds
    pods = f'{{{CLUSTER}, namespace=~"$namespace", namespace!=""}}'
    board = Layout()
    board.row("Fleet now")
    for title, description, expr, unit, limits in (
        (
            "GPUs",
            "Physical GPUs the exporters know, answering or not (a GPU with MIG counts once).",
            f"sum(cluster:gpu:count{in_cluster})",
            "short",
            NEUTRAL,
        ),
        (
            "GPUs down",
            "GPUs lost or not answering NVML now.",
            f"sum(cluster:gpu_down:count{in_cluster})",
            "short",
            ANY_IS_BAD,
        ),
        (
            "Throttled GPUs",
            "GPUs held down now by HW slowdown, HW/SW thermal slowdown or the power brake.",
            f"sum(cluster:gpu_throttled:count{in_cluster})",
            "short",
            thresholds("green", (1, "orange")),
        ),
        (
            "Busy-but-idle GPUs",
            f"GPUs classified busy but idle now, in full GPUs. {BUSY_BUT_IDLE_NOTE} "
            f"{MIG_WEIGHT_NOTE}",
            f"sum(cluster_class:gpu_bottleneck:count{{{CLUSTER}, {BUSY_BUT_IDLE}}})",
            "short",
            thresholds("green", (1, "orange")),
        ),
        (
            "Firing alerts",
            "Alerts Prometheus fires now (shipped rule pack).",
            f'count(ALERTS{{alertstate="firing", {CLUSTER}}}) or vector(0)',
            "short",
            ANY_IS_BAD,
        ),
    ):
        board.add(stat(title, description, Q(expr), unit=unit, thresholds_=limits), w=3, h=4)
    board.add(
        stat(
            "Mean utilization",
            f"NVML utilization averaged over all GPUs: busy, not necessarily useful. {MIG_NOTE}",
            Q(f"avg(cluster:gpu_utilization:avg{in_cluster})"),
            unit="percentunit",
            decimals=0,
        ),
        w=3,
        h=4,
    )
    board.add(
        stat(
            "Mean SM activity",
            f"SM activity averaged over the GPUs that report it. {ACTIVITY_NOTE} {MIG_WEIGHT_NOTE}",
            Q(f"avg(cluster:gpu_sm_active:avg{in_cluster})"),
            unit="percentunit",
            thresholds_=SM_ACTIVITY,
            decimals=0,
        ),
        w=3,
        h=4,
    )
    board.add(
        stat(
            "Wasted GPU-hours (range)",
            "GPU-hours over the range that GPUs held by pods spent idle or busy but idle. "
            "A MIG instance's hour counts as its share of a GPU-hour.",
            Q(f"sum({gpu_hours(f'namespace:gpu_waste_seconds:rate5m{held}')})"),
            unit="h",
            thresholds_=thresholds("green", (1, "orange")),
            decimals=1,
        ),
        w=3,
        h=4,
    )

    board.row("Efficiency")
    board.add(
        timeseries(
            "Fleet activity",
            "Fleet-wide mean utilization (dashed) against SM, Tensor and DRAM activity. The gap "
            f"between utilization and SM activity is GPU time spent without work. {ACTIVITY_NOTE} "
            f"{MIG_NOTE}",
            [
                Q(f"cluster:gpu_utilization:avg{in_cluster}", "{{cluster}} utilization"),
                Q(f"cluster:gpu_sm_active:avg{in_cluster}", "{{cluster}} SM active"),
                Q(f"cluster:gpu_tensor_active:avg{in_cluster}", "{{cluster}} Tensor active"),
                Q(f"cluster:gpu_dram_active:avg{in_cluster}", "{{cluster}} DRAM active"),
            ],
            unit="percentunit",
            limits=(0, 1),
            legend_calcs=("mean",),
            overrides=[override(".*utilization", DASHED, regexp=True)],
        ),
        w=12,
        h=8,
    )
    board.add(
        class_counts(
            "How many GPUs are in each class, over time, in full GPUs (a MIG instance counts as "
            f"its share of one). {CLASS_NOTE}",
            f"sum by (class) (cluster_class:gpu_bottleneck:count{in_cluster})",
        ),
        w=12,
        h=8,
    )
    board.add(
        table(
            "Efficiency and waste by namespace",
            "Per namespace: GPUs held now, mean utilization and SM/Tensor activity now, and "
            "GPU-hours over the range spent busy but idle and wasted (idle or busy but idle). "
            f"{BUSY_BUT_IDLE_NOTE} '(no pod)' is GPUs no pod holds: their idle time is spare "
            f"capacity, not waste. {ACTIVITY_NOTE} GPUs and GPU-hours are in full GPUs and the "
            f"means weighted by size: {MIG_NOTE}",
            [
                ("GPUs", Q(no_pod(f"namespace:gpu:count{in_namespace}"))),
                ("Utilization", Q(no_pod(f"namespace:gpu_utilization:avg{in_namespace}"))),
                ("SM active", Q(no_pod(f"namespace:gpu_sm_active:avg{in_namespace}"))),
                ("Tensor active", Q(no_pod(f"namespace:gpu_tensor_active:avg{in_namespace}"))),
                (
                    "Busy-but-idle GPU-hours",
                    Q(
                        no_pod(
                            gpu_hours(f"namespace:gpu_busy_but_idle_seconds:rate5m{in_namespace}")
                        )
                    ),
                ),
                (
                    "Wasted GPU-hours",
                    Q(no_pod(gpu_hours(f"namespace:gpu_waste_seconds:rate5m{in_namespace}"))),
                ),
            ],
            unit="percentunit",
            overrides=[
                override("GPUs", field_unit("short")),
                colored_cells("SM active", "percentunit", SM_ACTIVITY),
                override("Busy-but-idle GPU-hours", field_unit("h"), field_decimals(1)),
                colored_cells(
                    "Wasted GPU-hours", "h", thresholds("green", (1, "orange"), (24, "red"))
                ),
            ],
            sort_by="Wasted GPU-hours",
        ),
        w=14,
        h=9,
    )
    board.add(
        bargauge(
            "Wasted GPU-hours by namespace (range)",
            "GPU-hours over the range that each namespace's GPUs spent idle or busy but idle "
            "(a MIG instance's hour counts as its share of a GPU-hour).",
            Q(
                f"sort_desc({gpu_hours(f'namespace:gpu_waste_seconds:rate5m{pods}')})",
                "{{namespace}}",
            ),
            unit="h",
            thresholds_=thresholds("green", (1, "orange"), (24, "red")),
        ),
        w=10,
        h=9,
    )

    board.row("Top offenders")
    top_waste = f"topk(10, {gpu_hours(f'namespace_pod:gpu_waste_seconds:rate5m{pods}')})"
    board.add(
        table(
            "Top 10 pods by wasted GPU-hours (range)",
            "The pods whose GPUs spent the most GPU-hours idle or busy but idle over the range, "
            "and how much of it was busy but idle (kernels running, SMs empty: look at the "
            "code) rather than idle (nothing running: release the GPU). Tip: a pod with a "
            "high busy-but-idle share is where profiling pays off. A MIG instance's hour counts "
            "as its share of a GPU-hour.",
            [
                ("Wasted GPU-hours", Q(top_waste)),
                (
                    "Busy-but-idle GPU-hours",
                    Q(
                        f"{gpu_hours(f'namespace_pod:gpu_busy_but_idle_seconds:rate5m{pods}')} "
                        f"and on (cluster, namespace, pod) {top_waste}"
                    ),
                ),
            ],
            unit="h",
            overrides=[
                colored_cells(
                    "Wasted GPU-hours", "h", thresholds("green", (1, "orange"), (24, "red"))
                )
            ],
            sort_by="Wasted GPU-hours",
        ),
        w=14,
        h=9,
    )
    board.add(
        bargauge(
            "Busy-but-idle GPUs now, top 10 pods",
            "Pods with the most GPUs busy but idle, averaged over the last 5 minutes, in full "
            f"GPUs. {BUSY_BUT_IDLE_NOTE} {MIG_WEIGHT_NOTE}",
            Q(
                f"topk(10, namespace_pod:gpu_busy_but_idle_seconds:rate5m{pods})",
                "{{namespace}}/{{pod}}",
            ),
            unit="short",
            thresholds_=thresholds("green", (0.5, "orange"), (2, "red")),
        ),
        w=10,
        h=9,
    )

    board.row("Workloads: allocation and use by namespace")
    allocated = gpu_hours(f"namespace:gpu_allocated:sum{pods}")
    used = gpu_hours(f"namespace:gpu_pod_utilization:sum{pods}")
    energy = gpu_hours(f"namespace:gpu_pod_energy_joules:rate5m{pods}")
    idle_now = (
        f'count by (cluster, namespace) (ALERTS{{{ALLOCATED_BUT_IDLE}, alertstate="firing", '
        f'{CLUSTER}, namespace=~"$namespace"}})'
    )
    board.add(
        table(
            "GPU-hours, use and energy by namespace (range)",
            "Per namespace over the range: GPU-hours allocated (a GPU several pods share is "
            "split equally among them, so namespaces add up to the held GPUs; a MIG instance's "
            "hour counts as its share of a GPU-hour), GPU-hours its kernels actually ran "
            "(per-process utilization, whole GPUs only: NVML has none under MIG), their ratio, "
            "the energy charged to it (exclusive while a container ran alone, apportioned by "
            "SM-time share otherwise) and its containers GpuAllocatedButIdle fires for now. "
            f"{PER_POD_NOTE}",
            [
                ("Allocated GPU-hours", Q(allocated)),
                ("Used GPU-hours", Q(used)),
                ("Used share", Q(f"({used}) / ({allocated})")),
                ("Energy", Q(f"sum by (cluster, namespace) ({energy}) / 1000")),
                ("Idle allocations now", Q(idle_now)),
            ],
            unit="h",
            overrides=[
                override("Allocated GPU-hours", field_decimals(1)),
                override("Used GPU-hours", field_decimals(1)),
                colored_cells(
                    "Used share", "percentunit", thresholds("red", (0.2, "orange"), (0.5, "green"))
                ),
                override("Energy", field_unit("kwatth"), field_decimals(2)),
                colored_cells("Idle allocations now", "short", thresholds("green", (1, "orange"))),
            ],
            sort_by="Allocated GPU-hours",
        ),
        w=14,
        h=9,
    )
    board.add(
        timeseries(
            "GPUs allocated and used by namespace",
            "Full GPUs each namespace is allocated (a shared GPU split among the pods holding "
            "it) against the GPUs' worth of time its kernels ran (dashed; per-process "
            f"utilization, whole GPUs only). The gap is allocation nobody uses. {PER_POD_NOTE}",
            [
                Q(f"namespace:gpu_allocated:sum{pods}", "{{namespace}} allocated"),
                Q(f"namespace:gpu_pod_utilization:sum{pods}", "{{namespace}} used"),
            ],
            unit="short",
            legend_calcs=("mean",),
            overrides=[override(".* used", DASHED, regexp=True)],
        ),
        w=10,
        h=9,
    )
    board.add(
        timeseries(
            "GPU power charged by namespace",
            "Watts charged to each namespace's containers over 5 minutes: measured while a "
            "container runs alone on its GPU, apportioned by SM-time share on a shared one. "
            f"{PER_POD_NOTE}",
            [
                Q(
                    f"sum by (cluster, namespace) (namespace:gpu_pod_energy_joules:rate5m{pods})",
                    "{{namespace}}",
                )
            ],
            unit="watt",
            stack=True,
            legend_calcs=("mean", "max"),
        ),
        w=24,
        h=8,
    )

    board.row("Health")
    board.add(
        timeseries(
            "Throttled GPUs per node",
            "GPUs per node held down by HW slowdown, HW/SW thermal slowdown or the power brake "
            "(SW power cap at the power limit is normal and not counted). A whole node "
            "throttling at once points at cooling or power delivery, not at the workload.",
            [Q(f"node:gpu_throttled:count{in_node}", "{{node}}")],
            unit="short",
            stack=True,
            legend_calcs=("max",),
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "GPUs down per node",
            "GPUs per node that are lost or not answering NVML; 0 while all answer.",
            [Q(f"node:gpu_down:count{in_node}", "{{node}}")],
            unit="short",
            thresholds_=ANY_IS_BAD,
            legend_calcs=("max",),
        ),
        w=12,
        h=8,
    )
    board.add(
        table(
            "Nodes",
            "Per node: GPUs, GPUs down and GPUs throttled now, worst first.",
            [
                ("GPUs", Q(f"node:gpu:count{in_node}")),
                ("Down", Q(f"node:gpu_down:count{in_node}")),
                ("Throttled", Q(f"node:gpu_throttled:count{in_node}")),
            ],
            unit="short",
            overrides=[
                colored_cells("Down", "short", ANY_IS_BAD),
                colored_cells("Throttled", "short", thresholds("green", (1, "orange"))),
            ],
            sort_by="Down",
        ),
        w=12,
        h=8,
    )
    board.add(
        timeseries(
            "Fleet power draw and limit",
            "Sum of all GPUs' power draw and of their enforced limits (dashed).",
            [
                Q(f"cluster:gpu_power_watts:sum{in_cluster}", "{{cluster}} draw"),
                Q(f"cluster:gpu_power_limit_watts:sum{in_cluster}", "{{cluster}} limit"),
            ],
            unit="watt",
            overrides=[override(".*limit", DASHED, regexp=True)],
        ),
        w=12,
        h=8,
    )
    board.add(
        table(
            "Alerts by name",
            "Firing and pending alerts of the shipped rule pack, counted by name and severity. "
            "Empty when nothing is wrong.",
            [
                (
                    "Alerts",
                    Q(f"count by (alertname, alertstate, severity) (ALERTS{in_cluster})"),
                )
            ],
            unit="short",
            sort_by="Alerts",
            no_value="No alerts",
        ),
        w=24,
        h=7,
    )
    return dashboard(
        "gpu-exporter-fleet",
        "GPU fleet",
        "Cluster-wide GPU efficiency and waste by namespace, top offenders, throttled and down "
        "GPUs per node. Needs rules/gpu-exporter.recording.yaml loaded into Prometheus. "
        "gpu-exporter.",
        [datasource_variable(), CLUSTER_VARIABLE, NODE_VARIABLE, NAMESPACE_VARIABLE],
        board,
    )


# --- output ----------------------------------------------------------------------------------

DASHBOARDS: dict[str, Callable[[], grafana.Dashboard]] = {
    "gpu-efficiency.json": efficiency,
    "gpu-health.json": health,
    "gpu-fleet.json": fleet,
}


def render(build: Callable[[], grafana.Dashboard]) -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs")
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = args.out / name, render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run python dashboards/build.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
