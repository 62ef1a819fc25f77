"""One cause, one alert: a follow-on alert of the shipped pack is suppressed with `unless` and a
verbatim copy of the condition of the alert that owns the cause. A copy that drifted (another
threshold, another window) would hide the follow-on while the owner stays quiet, so no alert at
all; this test keeps every copy equal to its original, in every copy of the pack."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKS = [
    ROOT / "rules/gpu-exporter.rules.yaml",
    ROOT / "helm/gpu-exporter/files/rules/gpu-exporter.rules.yaml",
]
# follow-on alert -> the alerts whose conditions suppress it
SUPPRESSED_BY = {
    "GpuBusyButIdle": ("GpuLinkBound",),
    "GpuTensorCoresIdle": ("GpuMemoryBandwidthBound",),
    "GpuHardwareSlowdown": ("GpuThermalSlowdown", "GpuPowerBrakeSlowdown"),
    "GpuClocksLowWhileBusy": (
        "GpuHardwareSlowdown",
        "GpuThermalSlowdown",
        "GpuSoftwareThermalSlowdown",
        "GpuPowerBrakeSlowdown",
    ),
}


def normalized(expr: str) -> str:
    """The expression without PromQL comments, its whitespace collapsed."""
    return " ".join(re.sub(r"#[^\n]*", "", expr).split())


def exprs(pack: Path) -> dict[str, str]:
    groups = yaml.safe_load(pack.read_text())["groups"]
    return {r["alert"]: normalized(r["expr"]) for g in groups for r in g["rules"] if "alert" in r}


@pytest.mark.parametrize("pack", PACKS, ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.parametrize("follow_on", sorted(SUPPRESSED_BY))
def test_a_follow_on_is_suppressed_by_its_owners_own_condition(pack: Path, follow_on: str) -> None:
    found = exprs(pack)
    unless = found[follow_on].split(" unless ", 1)
    assert len(unless) == 2, f"{follow_on} has no unless clause"
    for owner in SUPPRESSED_BY[follow_on]:
        assert f"({found[owner]})" in unless[1] or found[owner] in unless[1], (
            f"{pack.name}: {follow_on}'s unless clause does not hold {owner}'s condition as "
            f"written in {owner}:\n  {found[owner]}"
        )


def test_the_check_sees_a_drifted_copy() -> None:
    original = exprs(PACKS[0])
    drifted = dict(original)
    drifted["GpuHardwareSlowdown"] = original["GpuHardwareSlowdown"].replace("> 0.05", "> 0")
    owner = original["GpuThermalSlowdown"]
    assert owner in original["GpuHardwareSlowdown"]
    assert owner not in drifted["GpuHardwareSlowdown"]
