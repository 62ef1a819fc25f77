"""dcgm-exporter compatibility: its family names, labels, units and text format on a second
endpoint (`/metrics/dcgm`, and optionally its own port), so dashboards, alerts, autoscalers
and tools written against dcgm-exporter keep working. docs/migrating-from-dcgm-exporter.md
says what maps to what and what differs on purpose."""
