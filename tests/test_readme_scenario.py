"""The README's description of the default scenario is the scenario's: which pods hold which
GPUs (and when), and which GPU no pod holds, written from gpu_exporter/sim/scenarios/mixed.yaml
here and looked up in the README."""

from __future__ import annotations

import re
from pathlib import Path

from gpu_exporter.cli import build_parser
from gpu_exporter.sim.scenario import load_scenario
from gpu_exporter.sim.spec import Scenario

ROOT = Path(__file__).resolve().parent.parent


def _gpus(indices: list[int]) -> str:
    if len(indices) == 1:
        return f"GPU {indices[0]}"
    return "GPUs " + ", ".join(map(str, indices[:-1])) + f" and {indices[-1]}"


def pods_sentence(scenario: Scenario) -> str:
    """Each pod (by first mention) with its GPUs, their labels and its lifetime, then the GPUs
    no pod ever holds."""
    labels = {d.index: d.label for d in scenario.devices}
    held: dict[tuple[str, float, float | None], list[int]] = {}
    for spec in scenario.pods:
        held.setdefault((f"{spec.namespace}/{spec.pod}", spec.start, spec.until), []).append(
            spec.gpu
        )
    parts = []
    for (name, start, until), gpus in held.items():
        when = (f" from {start:g} s" if start else "") + (
            f" until {until:g} s" if until is not None else ""
        )
        what = ", ".join(labels[g] for g in gpus)
        parts.append(f"`{name}` on {_gpus(gpus)} ({what}){when}")
    free = [d.index for d in scenario.devices if d.index not in {s.gpu for s in scenario.pods}]
    rest = ", ".join(f"GPU {i} ({labels[i]})" for i in free)
    return ", ".join(parts) + f"; {rest} {'is' if len(free) == 1 else 'are'} held by no pod"


def squashed(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_readme_describes_the_default_scenarios_pods() -> None:
    default = build_parser().parse_args(["serve", "--simulate"]).simulate
    expected = pods_sentence(load_scenario(default))
    readme = squashed((ROOT / "README.md").read_text())
    assert expected in readme, f"README.md should describe the {default} scenario as: {expected}"
