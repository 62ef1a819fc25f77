"""The `dcgm:` settings: off by default, precise errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.collect import dcgm
from gpu_exporter.collect.settings import DCGM_DEFAULT_FIELDS, DCGM_FIELDS, DcgmConfig
from gpu_exporter.config.load import ConfigError, load_config


def test_defaults_are_off() -> None:
    config = load_config(environ={})
    assert config.dcgm == DcgmConfig()
    assert DcgmConfig().mode == "off"  # opt-in: DCGM profiling holds the GPU's counters


def test_the_modes_are_spelled_once() -> None:
    from typing import get_args

    from gpu_exporter.collect.settings import DCGM_MODES

    assert get_args(DcgmConfig.model_fields["mode"].annotation) == DCGM_MODES


def test_every_watchable_field_has_one_family_and_the_defaults_are_watchable() -> None:
    assert tuple(f.field_id for f in dcgm.FIELDS) == DCGM_FIELDS
    assert set(DCGM_DEFAULT_FIELDS) <= set(DCGM_FIELDS)
    from gpu_exporter.model.catalog import BY_NAME

    assert all(BY_NAME[f.family].source == "gpm" for f in dcgm.FIELDS)  # GPM's own families


def test_field_ids_from_the_environment_are_checked_too() -> None:
    with pytest.raises(ConfigError, match="9999"):
        load_config(environ={"GPU_EXPORTER_DCGM__FIELDS": "1001,9999"})
    assert load_config(environ={"GPU_EXPORTER_DCGM__ADDRESS": "[::1]:5555"}).dcgm.address


def test_unquoted_off_is_off_although_yaml_reads_it_as_false(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("dcgm:\n  mode: off\n")
    assert load_config(path, environ={}).dcgm.mode == "off"


def test_file_environment_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("dcgm:\n  mode: standalone\n  address: nvidia-dcgm.gpu-operator.svc:5555\n")
    config = load_config(path, environ={"GPU_EXPORTER_DCGM__FIELDS": "1002,1004"})
    assert config.dcgm == DcgmConfig(
        mode="standalone", address="nvidia-dcgm.gpu-operator.svc:5555", fields=(1002, 1004)
    )
    flagged = load_config(path, {"dcgm.mode": "embedded", "dcgm.address": "unix:/run/dcgm.sock"})
    assert (flagged.dcgm.mode, flagged.dcgm.address) == ("embedded", "unix:/run/dcgm.sock")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("dcgm:\n  mode: on\n", "YAML boolean"),
        ("dcgm:\n  mode: remote\n", "dcgm.mode"),
        ("dcgm:\n  address: 'host:70000'\n", "dcgm.address"),
        ("dcgm:\n  address: unix:relative.sock\n", "dcgm.address"),
        ("dcgm:\n  address: http://host:5555\n", "dcgm.address"),
        ("dcgm:\n  fields: [1001, 9999]\n", "9999"),
        ("dcgm:\n  fields: [1002, 1002]\n", "twice"),
        ("dcgm:\n  fields: []\n", "dcgm.fields"),
        ("dcgm:\n  feilds: [1002]\n", "dcgm.feilds"),
        ("dcgm:\n  address: '::1'\n", "brackets"),
    ],
)
def test_bad_settings_name_file_line_and_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("interval_seconds: 1\n" + text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert named in str(caught.value)
    assert f"{path}:2" in str(caught.value) or f"{path}:3" in str(caught.value)
