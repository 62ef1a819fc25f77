"""Where the shipped rule pack lives: `rules/` in the source tree, `rulepack/` in the package."""

from __future__ import annotations

from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent / "rulepack"  # a link to ../../rules in the tree
# The pack's group whose alerts define an unhealthy GPU (diagnose and the status page read it).
HEALTH_GROUP = "gpu-health"
# The pack's alert on a device (or share of one) a container holds and does nothing with: the
# status page and /api/v1/devices mark the containers it fires for as waste.
ALLOCATED_BUT_IDLE = "GpuAllocatedButIdle"


def default_rule_files() -> list[str]:
    """What the daemon evaluates by default: the alerting rules. The recording rules feed the
    fleet dashboards in Prometheus; the daemon exposes no recorded series, so it skips them."""
    return [str(PACK_DIR / "gpu-exporter.rules.yaml")]


def all_pack_files() -> list[str]:
    """Everything shipped, as `gpu-exporter rules export` renders it into the PrometheusRule."""
    return [str(PACK_DIR / "*.yaml")]
