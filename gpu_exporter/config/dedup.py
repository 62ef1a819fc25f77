"""Whether Alertmanager can merge the daemon's alerts with Prometheus' copies of them.

Alertmanager treats two alerts as one only when their label sets are equal. The daemon's copy
is the series' labels plus its external labels (`node` from $NODE_NAME unless given); the
Prometheus copy is the series' labels plus what the ServiceMonitor's relabeling adds (`node`
from `__meta_kubernetes_pod_node_name`) plus Prometheus' own external labels. Both add an
external label only to alerts that lack one of that name (Prometheus notifier.go), so a name
the series carry themselves holds the GPU's value on some alerts and the configured one on
others. Checked once at start; each problem is one WARNING naming the setting to change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from gpu_exporter.config.load import FLAG_NAMES, node_name
from gpu_exporter.model.catalog import FAMILIES, INSTANCE_LABELS
from gpu_exporter.model.promnames import label_name_problem
from gpu_exporter.model.series import ATTRIBUTION_LABELS, DEVICE_LABELS

log = logging.getLogger(__name__)

_SETTING = "alerting.external_labels"
SETTING_NAMES = f"{_SETTING} (--{FLAG_NAMES[_SETTING]}, Helm alerting.externalLabels)"

# Every label an alert of the exporter's series can carry before external labels are added.
SERIES_LABELS = frozenset(
    {
        "alertname",
        "le",  # histogram buckets
        *DEVICE_LABELS,
        *INSTANCE_LABELS,
        *ATTRIBUTION_LABELS,
        *(label for family in FAMILIES for label in family.labels),
    }
)


def label_mismatches(external_labels: Mapping[str, str], node: str) -> list[str]:
    """Why the daemon's alerts, sent with `external_labels` (as configured, before `node` is
    added) from a node whose $NODE_NAME is `node` ("" when unset), can differ from the copies
    Prometheus sends from the shipped ServiceMonitor's series; one sentence per problem."""
    problems = []
    if "node" not in external_labels and not node:
        problems.append(
            "alerts sent to Alertmanager carry no node label, but Prometheus' copies get one "
            "from the ServiceMonitor's relabeling (__meta_kubernetes_pod_node_name), so "
            "Alertmanager cannot merge the two: set $NODE_NAME (the DaemonSet sets it from "
            f"spec.nodeName) or node=<node name> in {SETTING_NAMES}"
        )
    elif node and external_labels.get("node", node) != node:
        problems.append(
            f"{_SETTING} node={external_labels['node']!r} differs from $NODE_NAME "
            f"{node!r}, the node Prometheus' copies name (ServiceMonitor relabeling from "
            "__meta_kubernetes_pod_node_name), so Alertmanager cannot merge the two: remove "
            f"node from {SETTING_NAMES}"
        )
    for name in sorted(external_labels):
        problem = label_name_problem(name)
        if problem is not None:
            problems.append(f"{_SETTING}: {problem}; rename it in {SETTING_NAMES}")
        elif name in SERIES_LABELS:
            problems.append(
                f"{_SETTING} {name!r} is a label of the exporter's own series: alerts that have "
                f"it keep their value and only the others get {external_labels[name]!r}, so the "
                "copies of one alert from the daemon and from Prometheus (where relabeling may "
                "set it) need not match and routing or inhibition by it misleads: use another "
                f"name (e.g. cluster) in {SETTING_NAMES}"
            )
    return problems


def warn_label_mismatches(
    external_labels: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> None:
    """Log each of `label_mismatches` once, at WARNING (at start, when alerts are sent)."""
    node = node_name(os.environ if environ is None else environ)
    for problem in label_mismatches(external_labels, node):
        log.warning("%s", problem)
