"""support/validation.py: pydantic errors as `file:line: field: message`, in a file's own words."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from gpu_exporter.alerting.rules.loader import RuleFileError, load_rule_files
from gpu_exporter.support.validation import InputError, Wording, validate
from gpu_exporter.support.yamlfile import load_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Xid(_Strict):
    kind: Literal["xid"]
    at: float
    xid: int


class Hang(_Strict):
    kind: Literal["hang"]
    at: float
    duration: float = Field(gt=0)


class Device(_Strict):
    name: str = "gpu"
    memory: int = Field(default=1, ge=0)


class Node(_Strict):
    devices: list[Device]
    faults: list[Annotated[Xid | Hang, Field(discriminator="kind")]] = []
    labels: dict[str, Device] = {}


WORDS = Wording(
    unknown_key="unknown key {key!r} (known: {known})",
    missing_key="missing required key {key!r}",
)


def problems(text: str, wording: Wording = WORDS) -> list[str]:
    with pytest.raises(InputError) as caught:
        validate(Node, load_yaml(text, "n.yaml"), wording=wording)
    return list(caught.value.problems)


def test_a_valid_file_is_the_model() -> None:
    node = validate(Node, load_yaml("devices: [{name: a}]\n", "n.yaml"))
    assert node.devices == [Device(name="a")]


def test_unknown_keys_name_their_line_and_the_known_ones() -> None:
    assert problems("devices:\n  - name: a\n    colour: blue\n") == [
        "n.yaml:3: devices[0].colour: unknown key 'colour' (known: memory, name)"
    ]
    assert problems("devices: []\nlabels:\n  x: {size: 1}\n") == [
        "n.yaml:3: labels.x.size: unknown key 'size' (known: memory, name)"
    ]


def test_a_missing_key_is_reported_at_its_mapping() -> None:
    assert problems("devices: []\nfaults:\n  - {kind: hang, at: 3}\n") == [
        "n.yaml:3: faults[0]: missing required key 'duration'"
    ]


def test_a_tagged_union_reports_through_its_member_without_the_tag() -> None:
    assert problems("devices: []\nfaults:\n  - {kind: hang, at: 3, duration: 0}\n") == [
        "n.yaml:3: faults[0].duration: Input should be greater than 0"
    ]
    assert problems("devices: []\nfaults:\n  - {kind: hang, at: 1, duration: 1, xid: 2}\n") == [
        "n.yaml:3: faults[0].xid: unknown key 'xid' (known: at, duration, kind)"
    ]


def test_each_problem_is_one_line_and_the_default_wording_is_plain() -> None:
    found = problems("devices:\n  - memory: -1\n  - nam: x\n", Wording())
    assert found == [
        "n.yaml:2: devices[0].memory: Input should be greater than or equal to 0",
        "n.yaml:3: devices[1].nam: unknown field",
    ]
    assert problems("devices: {a: 1}\n", Wording()) == [
        "n.yaml:1: devices: expected a list, got a mapping"
    ]
    assert problems("- a\n", Wording()) == ["n.yaml: (top level): expected a mapping, got a list"]


def test_a_rule_file_names_each_shape_problem_at_its_line(tmp_path: Path) -> None:
    """The rule loader's shape (a union chosen by which key a rule has) through the validator."""
    path = tmp_path / "r.yaml"
    path.write_text(
        "groups:\n"
        "  - name: g\n"
        "    rules:\n"
        "      - alert: A\n"
        "        expr: up == 0\n"
        "        colour: blue\n"  # 6
        "      - {record: x, alert: y}\n"  # 7
        "      - {alert: B, expr: up, labels: [a]}\n"  # 8
        "  - {name: '', limit: -1}\n"  # 9
    )
    with pytest.raises(RuleFileError) as caught:
        load_rule_files([path])
    assert caught.value.problems == [
        f"{path}:6: groups[0].rules[0].colour: key not allowed here; allowed: alert, "
        "annotations, expr, for, keep_firing_for, labels",
        f"{path}:7: groups[0].rules[1]: a rule is a mapping with exactly one of `alert` or "
        "`record`",
        f"{path}:8: groups[0].rules[2].labels: must be a mapping",
        f"{path}:9: groups[1].name: a group's name must be a non-empty string",
        f"{path}:9: groups[1].limit: must be a non-negative integer",
    ]
