"""The activity quantities and DCGM's field ids are written once (gpu_exporter/model/activity.py,
gpu_exporter/model/dcgm_fields.py); every table that must agree with them is checked here:
against the vendor's NVML binding, the GPM collector, the DCGM source, its settings and its
binding, the dcgm-exporter compatible output and the simulator's fakes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pynvml as N
import pytest

from gpu_exporter.collect import dcgm, dcgm_api
from gpu_exporter.collect.nvml.collectors import gpm
from gpu_exporter.collect.settings import DCGM_DEFAULT_FIELDS, DCGM_FIELDS
from gpu_exporter.model import activity
from gpu_exporter.model.activity import ACTIVITY, Activity
from gpu_exporter.model.catalog import BY_NAME as CATALOG
from gpu_exporter.model.dcgm_fields import ALIASES, FIELD_IDS
from gpu_exporter.sim import activity as sim_activity
from gpu_exporter.sim import fake_dcgm, fake_nvml, scenario
from gpu_exporter.web.dcgm_compat.fields import FIELDS as COMPAT_FIELDS

ROOT = Path(__file__).resolve().parents[1]


def _key(row: Activity) -> tuple[str, tuple[tuple[str, str], ...]]:
    return row.family, row.labels


@pytest.mark.parametrize("row", ACTIVITY, ids=lambda row: row.gpm_name)
def test_gpm_metric_ids_are_the_bindings(row: Activity) -> None:
    assert getattr(N, f"NVML_GPM_METRIC_{row.gpm_name}") == row.gpm_metric


def test_one_row_per_quantity_metric_and_field() -> None:
    for column in (_key, lambda r: r.gpm_metric, lambda r: r.dcgm_field, lambda r: r.dcgm_name):
        values = [column(row) for row in ACTIVITY]
        assert len(set(values)) == len(values)
    assert all(row.dcgm_name.startswith("DCGM_FI_PROF_") for row in ACTIVITY)
    assert all(CATALOG[row.family].source == "gpm" for row in ACTIVITY)  # GPM's own families
    assert list(activity.BY_DCGM_FIELD) == sorted(row.dcgm_field for row in ACTIVITY)


def test_the_gpm_collector_reads_every_quantity_as_its_family() -> None:
    assert [(m.gpm_metric, m.family, m.labels) for m in gpm.METRICS] == [
        (row.gpm_metric, row.family, row.labels) for row in ACTIVITY
    ]


def test_the_dcgm_source_and_its_settings_read_the_table() -> None:
    by_field = {row.dcgm_field: row for row in ACTIVITY}
    assert {f.field_id: (f.family, f.labels) for f in dcgm.FIELDS} == {
        field_id: _key(row) for field_id, row in by_field.items()
    }
    assert dcgm.BY_ID.keys() == by_field.keys()
    assert tuple(sorted(by_field)) == DCGM_FIELDS
    assert tuple(sorted(r.dcgm_field for r in ACTIVITY if r.dcgm_default)) == DCGM_DEFAULT_FIELDS
    assert FIELD_IDS["DCGM_FI_DEV_UUID"] == dcgm_api.FI_DEV_GPU_UUID
    # What the documentation and the deployment files promise (docs/kubernetes.md, "DCGM").
    assert DCGM_DEFAULT_FIELDS == (1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008)


def test_every_dcgm_id_is_written_once() -> None:
    own = [field_id for name, field_id in FIELD_IDS.items() if name not in ALIASES]
    assert len(set(own)) == len(own)
    for alias, name in ALIASES.items():
        assert FIELD_IDS[alias] == FIELD_IDS[name]
    for row in ACTIVITY:
        assert FIELD_IDS[row.dcgm_name] == row.dcgm_field


def test_every_compat_row_resolves_through_the_tables() -> None:
    activity_families = {_key(row) for row in ACTIVITY}
    for field in COMPAT_FIELDS:
        assert field.field_id == FIELD_IDS[field.name], field.name
        row = activity.BY_DCGM_NAME.get(field.name)
        if row is not None:  # an activity field: the family GPM fills, as it is
            assert (field.native, field.labels) == _key(row), field.name
            assert (field.type, field.integer, field.scale) == ("gauge", False, 1.0)
        else:
            assert (field.native, field.labels) not in activity_families, field.name
    profiling = [f.name for f in COMPAT_FIELDS if f.name.startswith("DCGM_FI_PROF_")]
    assert {row.dcgm_name for row in ACTIVITY} - set(profiling) == {"DCGM_FI_PROF_PIPE_INT_ACTIVE"}


def test_both_fakes_serve_each_quantity_from_one_mapping() -> None:
    assert set(sim_activity.QUANTITIES) | {sim_activity.HMMA} == set(ACTIVITY)
    assert sim_activity.HMMA not in sim_activity.QUANTITIES
    quantities = list(sim_activity.QUANTITIES.values())
    assert len(set(quantities)) == len(quantities)
    assert set(quantities) <= set(scenario.QUANTITIES)
    served = fake_dcgm.served_fields()
    for row in ACTIVITY:
        assert row.dcgm_field in served and row.dcgm_field in fake_dcgm.PROFILING_FIELDS
        assert row.gpm_metric in fake_nvml._GPM_METRICS
        assert row.gpm_metric in fake_nvml._GPM_INSTANCE_METRICS


def test_the_hmma_share_is_what_the_other_tensor_pipes_leave() -> None:
    values = {"tensor_active": 0.5, "tensor_imma_active": 0.1, "tensor_dfma_active": 0.15}
    assert sim_activity.hmma_share(values.__getitem__) == pytest.approx(0.25)
    values["tensor_dfma_active"] = 0.6
    assert sim_activity.hmma_share(values.__getitem__) == 0.0


def test_the_tables_import_without_pynvml() -> None:
    code = (
        "import sys; import gpu_exporter.model.activity, gpu_exporter.model.dcgm_fields; "
        "assert 'pynvml' not in sys.modules, 'pynvml was imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
