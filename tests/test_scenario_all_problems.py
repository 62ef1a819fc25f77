"""A scenario file's problems are reported together, each with file:line and field: the checks
across sections (shared ids, faults that need a section the file lacks, a fault on an unknown
process) list every case, and beside the problems of the fields, not after they are fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.sim.scenario import ScenarioError, load_scenario


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(str(path))
    prefix = f"{path}:"
    lines = str(caught.value).splitlines()
    assert all(line.startswith(prefix) for line in lines), lines
    return sorted(line.removeprefix(prefix) for line in lines)


def test_every_check_across_sections_reports_every_case(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        "name: x\n"
        "devices:\n"
        "  - {model: NVIDIA H200, uuid: GPU-a}\n"
        "  - {model: NVIDIA H200, uuid: GPU-a}\n"
        "  - {model: NVIDIA H200, pci_bus_id: '00000000:99:00.0'}\n"
        "  - {model: NVIDIA H200, pci_bus_id: '00000000:99:00.0'}\n"
        "faults:\n"
        "  - {kind: dcgm_down, at: 1, until: 2}\n"
        "  - {kind: dcgm_down, at: 3, until: 4}\n"
        "  - {kind: cri_down, at: 1, until: 2}\n",
    )
    assert found == [
        "10: faults[2].kind: cri_down needs `processes:`",
        "4: devices[1].uuid: UUID 'GPU-a' is also GPU 0's",
        "6: devices[3].pci_bus_id: PCI bus id '00000000:99:00.0' is also GPU 2's",
        "8: faults[0].kind: dcgm_down needs a top-level `dcgm:` section",
        "9: faults[1].kind: dcgm_down needs a top-level `dcgm:` section",
    ]


def test_a_missing_section_is_reported_beside_the_fields_problems(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        "name: x\n"
        "devices:\n"
        "  - {model: NVIDIA H200, colour: blue}\n"
        "faults:\n"
        "  - {kind: dcgm_down, at: 1, until: 2}\n"
        "  - {kind: xid, at: -1, device: 0, xid: 79}\n",
    )
    assert [line.split(": ", 2)[:2] for line in found] == [
        ["3", "devices[0].colour"],
        ["5", "faults[0].kind"],
        ["6", "faults[1].at"],
    ]
