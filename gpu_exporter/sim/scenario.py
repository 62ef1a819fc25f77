"""Scenario files for the fake NVML and libdcgm: where they come from (docs/scenarios.md).

`load_scenario` reads a built-in, a file or a mapping with the one bounded YAML loader
(`support.yamlfile`) and validates it with the models of `sim.spec` through
`support.validation`, so every problem is a line `file:line: field.path: message`. It sits
above the models and the fakes: what a scenario is checked against that only the fakes know
(the C functions they implement, the DCGM fields served) reaches the models through the
validation context, so the models import no fake and the fakes import the models.

The models and tables are re-exported here: `sim.scenario` is the scenario format's one name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_exporter.sim import fake_dcgm, fake_nvml
from gpu_exporter.sim.fields import WORDING
from gpu_exporter.sim.spec import (
    ARCHITECTURES,
    COMPUTE_MODES,
    DCGM_HOST_ENGINE_PORT,
    FEATURES,
    MAX_DEVICES,
    NO_DEVICE,
    TOPOLOGY_LEVELS,
    DcgmSpec,
    DeviceSpec,
    DriverSpec,
    FaultSpec,
    LatencySpec,
    PodSpec,
    ProcessSpec,
    Scenario,
    TopologyGroup,
    normalize_bus_id,
    normalize_dcgm_address,
)
from gpu_exporter.sim.values import CLOCK_EVENT_REASONS, QUANTITIES, ValueSpec
from gpu_exporter.support.validation import InputError, validate
from gpu_exporter.support.yamlfile import LocatedYaml, YamlFileError, load_yaml, load_yaml_file

__all__ = [
    "ARCHITECTURES",
    "CLOCK_EVENT_REASONS",
    "COMPUTE_MODES",
    "DCGM_HOST_ENGINE_PORT",
    "FEATURES",
    "MAX_DEVICES",
    "NO_DEVICE",
    "QUANTITIES",
    "TOPOLOGY_LEVELS",
    "DcgmSpec",
    "DeviceSpec",
    "DriverSpec",
    "FaultSpec",
    "LatencySpec",
    "PodSpec",
    "ProcessSpec",
    "Scenario",
    "ScenarioError",
    "TopologyGroup",
    "ValueSpec",
    "builtin_path",
    "builtin_scenarios",
    "load_scenario",
    "normalize_bus_id",
    "normalize_dcgm_address",
]


class ScenarioError(InputError):
    """A scenario that cannot be loaded: one line per problem, naming file, line and field."""


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in gpu_exporter/sim/scenarios/."""
    folder = resources.files("gpu_exporter.sim") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def builtin_path(name: str) -> Path:
    """The file of a built-in scenario (for tools and tests that derive their own from it)."""
    return Path(str(resources.files("gpu_exporter.sim") / "scenarios" / f"{name}.yaml"))


def names_a_file(text: str) -> bool:
    """Whether a scenario argument is a file's path (it has a `/` or ends in .yaml or .yml)
    rather than a built-in's name: `--simulate mixed` is the built-in even where the working
    directory holds something called `mixed`, and `./mixed` is that file."""
    return "/" in text or text.endswith((".yaml", ".yml"))


def load_scenario(name_or_path: str | Path | Mapping[str, Any]) -> Scenario:
    """Load a scenario from a mapping, a YAML file path (a Path, or a string `names_a_file`
    says is one), or a built-in name."""
    if isinstance(name_or_path, Mapping):
        return _validated(LocatedYaml(dict(name_or_path), "<dict>"))
    path = Path(name_or_path)
    try:
        if isinstance(name_or_path, str) and not names_a_file(name_or_path):
            if name_or_path not in builtin_scenarios():
                known = ", ".join(builtin_scenarios())
                here = f" (the file {name_or_path} is ./{name_or_path})" if path.exists() else ""
                raise ScenarioError(
                    [
                        f"{name_or_path}: no such scenario file or built-in; a file is named by "
                        f"a path, with a / or ending in .yaml or .yml{here} (built-ins: {known})"
                    ]
                )
            resource = resources.files("gpu_exporter.sim") / "scenarios" / f"{name_or_path}.yaml"
            located = load_yaml(resource.read_text(encoding="utf-8"), str(resource))
        else:
            located = load_yaml_file(path)  # bounded: size, depth, aliases
    except YamlFileError as exc:
        raise ScenarioError([str(exc)]) from None
    return _validated(located)


def _validated(located: LocatedYaml) -> Scenario:
    try:
        return validate(Scenario, located, wording=WORDING, context=_context(located.filename))
    except InputError as exc:
        raise ScenarioError(exc.problems) from None


def _context(source: str) -> dict[str, Any]:
    return {"source": source, **_implemented()}


@functools.cache
def _implemented() -> dict[str, frozenset[Any]]:
    """What the fakes implement, from their own tables: the names a scenario may use."""
    return {
        "nvml_functions": fake_nvml.implemented_functions(),
        "dcgm_functions": fake_dcgm.implemented_functions(),
        "dcgm_fields": fake_dcgm.served_fields(),
    }
