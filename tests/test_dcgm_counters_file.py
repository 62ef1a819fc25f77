"""dcgm-exporter counters files (its `-f/--collectors` CSV) for /metrics/dcgm: read as
dcgm-exporter reads them, each problem named by file and line, each row resolved to a family,
a label, an error or a row not served.

dcgm-exporter's own files (tests/upstream/dcgm-exporter, vendored byte for byte at d5e5f51,
Apache License 2.0) are the main input; the expectations about them are derived from their
lines here, not from the code under test.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import pytest

from gpu_exporter.model import dcgm_fields
from gpu_exporter.model.dcgm_field_names import DCGM_EXPORTER_4_8, LATER
from gpu_exporter.model.series import Series, SeriesSet, series
from gpu_exporter.web.dcgm_compat.counters_file import parse_counters
from gpu_exporter.web.dcgm_compat.fields import BY_NAME, DEFAULT_FIELDS, FIELDS
from gpu_exporter.web.dcgm_compat.render import render
from gpu_exporter.web.dcgm_compat.selection import (
    DEFAULT,
    CountersFileError,
    Family,
    load_selection,
    read_counters_file,
    resolve_counters,
)

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "tests/upstream/dcgm-exporter"
DEFAULT_FILE = UPSTREAM / "default-counters.csv"
DCP_FILE = UPSTREAM / "dcp-metrics-included.csv"
V1_FILE = UPSTREAM / "1.x-compatibility-metrics.csv"
GUIDE = ROOT / "docs/migrating-from-dcgm-exporter.md"


def active_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line, fields) of every line that is neither blank nor a comment: the plain reading
    of a file without quotes, independent of the parser under test."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip() and not line.startswith("#"):
            rows.append((number, [field.strip(" ") for field in line.split(",")]))
    return rows


# -- the vendored files -------------------------------------------------------------------------


def test_vendored_files_are_upstreams_byte_for_byte() -> None:
    provenance = (UPSTREAM / "PROVENANCE").read_text()
    listed = re.findall(r"^100644 blob ([0-9a-f]{40})\t(\S+)$", provenance, re.M)
    assert len(listed) == 4
    for blob, path in listed:
        data = (UPSTREAM / Path(path).name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, path


@pytest.mark.parametrize("path", [DEFAULT_FILE, DCP_FILE], ids=lambda p: p.name)
def test_the_shipped_files_are_served_but_the_vgpu_row(path: Path) -> None:
    counters = read_counters_file(str(path))
    rows = active_rows(path)
    assert counters.errors == ()
    served = {family.name: family for family in counters.selection.families}
    labels = [label.name for label in counters.selection.labels]
    for number, (name, type_, help_) in rows:
        if name == "DCGM_FI_DEV_VGPU_LICENSE_STATUS":
            why = "vGPU guests only; the daemon reads no vGPU state"
            field_id = DCGM_EXPORTER_4_8[name]
            assert counters.unserved == (f"{path}:{number}: {name} (DCGM field {field_id}): {why}",)
        elif type_ == "label":
            assert labels == [name]
        else:
            family = served.pop(name)
            assert (family.type, family.help) == (type_, help_), name
            assert family.field.field_id == DCGM_EXPORTER_4_8[name]
    assert served == {}


def test_families_come_in_dcgm_exporters_order_field_id_then_name() -> None:
    counters = read_counters_file(str(DEFAULT_FILE))
    keys = [(DCGM_EXPORTER_4_8[f.name], f.name) for f in counters.selection.families]
    assert keys == sorted(keys)
    # The file's own order is not the id order (NVLink before the remapped rows): the sort is
    # not a no-op.
    in_file = [DCGM_EXPORTER_4_8[fields[0]] for _, fields in active_rows(DEFAULT_FILE)]
    assert in_file != sorted(in_file)


def test_dcgm_exporter_1x_names_serve_the_same_fields() -> None:
    counters = read_counters_file(str(V1_FILE))
    assert counters.errors == ()
    by_name = {family.name: family.field for family in counters.selection.families}
    for _, (name, _, _) in active_rows(V1_FILE):
        field = by_name.get(name)
        if field is not None:
            assert field.field_id == DCGM_EXPORTER_4_8[name]
    assert by_name["dcgm_gpu_temp"] is BY_NAME["DCGM_FI_DEV_GPU_TEMP"]
    assert by_name["dcgm_sm_clock"] is BY_NAME["DCGM_FI_DEV_SM_CLOCK"]
    # Every field the 1.x file names is one the output gives (its repeats: see below).
    assert set(by_name) == {fields[0] for _, fields in active_rows(V1_FILE)}
    names = resolve_counters("dcgm_pcie_tx_throughput, gauge, PCIe TX (in KB/s)\n", "v1.csv")
    assert names.unserved == ("v1.csv:1: dcgm_pcie_tx_throughput (DCGM field 200): the daemon "
                              "does not read it",)  # fmt: skip


def test_the_mapping_tables_ids_are_dcgms() -> None:
    """Every DCGM name the package writes has go-dcgm's id (the table dcgm-exporter reads)."""
    for name, field_id in dcgm_fields.FIELD_IDS.items():
        assert DCGM_EXPORTER_4_8.get(name) == field_id, name
    assert not set(DCGM_EXPORTER_4_8) & set(LATER)


# -- the format ---------------------------------------------------------------------------------


def test_comments_blanks_spaces_and_quotes_as_encoding_csv_reads_them() -> None:
    text = (
        "# a comment, with commas\n"
        "\n"
        "   \n"
        "DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).\r\n"
        'DCGM_FI_DEV_GPU_TEMP, gauge,"GPU temperature, die (in C)."\n'
        'DCGM_FI_DEV_SM_CLOCK,gauge,"two\n'
        "# not a comment: inside quotes\n"
        'lines, a ""quote"""\n'
        "DCGM_FI_DEV_MEM_CLOCK,counter,\n"
    )
    parsed = parse_counters(text, "c.csv")
    assert parsed.errors == ()
    quoted = 'two\n# not a comment: inside quotes\nlines, a "quote"'
    assert [(row.line, row.name, row.type, row.help) for row in parsed.rows] == [
        (4, "DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
        (5, "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature, die (in C)."),
        (6, "DCGM_FI_DEV_SM_CLOCK", "gauge", quoted),
        (9, "DCGM_FI_DEV_MEM_CLOCK", "counter", ""),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("DCGM_FI_DEV_GPU_TEMP, gauge", "expected 3 fields (DCGM field, Prometheus type, help "
         "text), found 2"),
        ("DCGM_FI_DEV_GPU_TEMP, gauge, a, b", "found 4"),
        ("DCGM_FI_DEV_GPU_TEMP, Gauge, x", "DCGM_FI_DEV_GPU_TEMP: unknown Prometheus type "
         "'Gauge': expected gauge, counter or label"),
        ("DCGM_FI_DEV_GPU_TEMP, histogram, x", "a DCGM field is one value, not a histogram: use "
         "gauge or counter"),
        ("DCGM_FI_DEV_GPU_TEMP, summary, x", "not a summary"),
        (" , gauge, x", "the DCGM field (first column) is empty"),
        ('DCGM_FI_DEV_GPU_TEMP, gauge, "a, b"', "column 30: a quote in a field that is not "
         "quoted"),
        ('DCGM_FI_DEV_GPU_TEMP, gauge,"a" b', "column 32: a closing quote must be followed by "
         "a comma or the line's end"),
        ('DCGM_FI_DEV_GPU_TEMP, gauge,"a', "a quoted field is never closed"),
    ],
)  # fmt: skip
def test_each_format_error_names_the_file_and_line(line: str, expected: str) -> None:
    text = (
        f"# header\n\nDCGM_FI_DEV_SM_CLOCK, gauge, ok\n{line}\nDCGM_FI_DEV_MEM_CLOCK, gauge, ok\n"
    )
    parsed = parse_counters(text, "site.csv")
    assert len(parsed.errors) == 1 and parsed.errors[0].startswith("site.csv:4: "), parsed.errors
    assert expected in parsed.errors[0], parsed.errors
    names = [row.name for row in parsed.rows]
    if "never closed" not in expected:  # the unclosed quote swallows the rest of the file
        assert names == ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"]


def test_every_problem_is_reported_not_only_the_first() -> None:
    text = 'A, gauge\nDCGM_FI_DEV_GPU_TEMP, gauge, x\nB, bogus, y\nC, gauge, "z" \n'
    parsed = parse_counters(text, "f.csv")
    assert [error.split(": ")[0] for error in parsed.errors] == ["f.csv:1", "f.csv:3", "f.csv:4"]


def test_a_name_given_twice_is_served_from_its_first_row_and_reported() -> None:
    """dcgm-exporter's own 1.x file names its PCIe byte fields twice: not an error."""
    path = str(V1_FILE)
    counters = read_counters_file(path)
    assert counters.errors == ()
    repeats = [(number, fields[0]) for number, fields in active_rows(V1_FILE)]
    seen: dict[str, int] = {}
    expected = []
    for number, name in repeats:
        if name in seen:
            expected.append(
                f"{path}:{number}: {name} is already on line {seen[name]}, which is served"
            )
        seen.setdefault(name, number)
    assert expected and [w for w in counters.unserved if "already on line" in w] == expected
    helps = {family.name: family.help for family in counters.selection.families}
    first = dict(reversed([(fields[0], fields[2]) for _, fields in active_rows(V1_FILE)]))
    assert helps["dcgm_fi_prof_pcie_tx_bytes"] == first["dcgm_fi_prof_pcie_tx_bytes"]
    assert counters.problems(strict=True)[: len(counters.errors)] == []  # no errors first
    assert set(expected) <= set(counters.problems(strict=True))


def test_an_empty_file_and_an_unreadable_one_are_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("# only\n# comments\n\n")
    assert read_counters_file(str(empty)).errors == (
        f"{empty}: no rows (DCGM field, Prometheus type, help text): every line is blank or "
        "a comment",
    )
    assert read_counters_file(str(tmp_path)).errors == (
        f"{tmp_path}: cannot read: a directory, not a regular file",
    )
    binary = tmp_path / "latin1.csv"
    binary.write_bytes(b"DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_SM_CLOCK, gauge, \xe9\n")
    assert read_counters_file(str(binary)).errors == (f"{binary}:2: not UTF-8 text (byte 60)",)


# -- resolving the names ------------------------------------------------------------------------


def test_an_unknown_field_is_an_error_naming_its_line_with_a_suggestion() -> None:
    text = "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_GPU_TEMPERATURE, gauge, t\n"
    counters = resolve_counters(text, "site.csv")
    assert counters.errors == (
        "site.csv:2: unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPERATURE'; did you mean "
        "DCGM_FI_DEV_GPU_TEMP?",
    )
    assert counters.problems(strict=False) == list(counters.errors)
    indented = resolve_counters("  # DCGM_FI_DEV_GPU_TEMP, gauge, t\n", "c.csv")
    assert indented.errors == (
        "c.csv:1: unknown DCGM field '# DCGM_FI_DEV_GPU_TEMP': a comment's # must be the "
        "line's first character",
    )


def test_what_dcgm_knows_but_the_output_does_not_give_is_a_warning_or_strict_error() -> None:
    text = (
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
        "DCGM_EXP_XID_ERRORS_COUNT, counter, reported XIDs during last window\n"
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\n"
        "DCGM_FI_DEV_BRAND, label, Device Brand\n"
        "DCGM_FI_DEV_SM_CLOCK, label, x\n"
        "DCGM_FI_DRIVER_VERSION, gauge, x\n"
        "DCGM_FI_DEV_MAX_VIDEO_CLOCK, gauge, x\n"
    )
    counters = resolve_counters(text, "c.csv")
    assert counters.errors == ()
    assert [f.name for f in counters.selection.families] == ["DCGM_FI_DEV_GPU_TEMP"]
    assert counters.selection.labels == ()
    lines = [int(warning.split(":")[1]) for warning in counters.unserved]
    assert lines == [2, 3, 4, 5, 6, 7]
    text_of = dict(zip(lines, counters.unserved, strict=True))
    assert "increase(gpu_xid_errors_total[5m])" in text_of[2]
    assert text_of[3] == (
        "c.csv:3: DCGM_FI_DEV_GPU_TEMP_CELSIUS: DCGM 4.6's name for field 150, which "
        "dcgm-exporter 4.9 writes in other units; /metrics/dcgm follows dcgm-exporter 4.8: "
        "name it DCGM_FI_DEV_GPU_TEMP (in its units)"
    )
    assert "a label row, but the field is a field the daemon does not read" in text_of[4]
    assert "a label row, but the field is a number" in text_of[5]
    assert "a string, which dcgm-exporter can only use as a label row" in text_of[6]
    assert text_of[7] == "c.csv:7: DCGM_FI_DEV_MAX_VIDEO_CLOCK (DCGM field 115): the daemon " \
        "does not read it"  # fmt: skip
    assert counters.problems(strict=False) == []
    assert counters.problems(strict=True) == list(counters.unserved)


def test_load_selection_logs_each_row_not_served_once_or_refuses_with_strict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.csv"
    path.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, v\n")
    with caplog.at_level(logging.WARNING):
        selection = load_selection(str(path), strict=False)
    assert [f.name for f in selection.families] == ["DCGM_FI_DEV_GPU_TEMP"]
    warned = [r.getMessage() for r in caplog.records if "VGPU_LICENSE" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"{path}:2: ")
    with pytest.raises(CountersFileError) as refused:
        load_selection(str(path), strict=True)
    assert refused.value.problems == [warned[0].split(": not served on")[0]]
    path.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NOPE, gauge, v\nX, y\n")
    with pytest.raises(CountersFileError) as refused:
        load_selection(str(path), strict=False)
    assert [problem.split(": ")[0] for problem in refused.value.problems] == [
        f"{path}:3",
        f"{path}:2",
    ]
    assert load_selection(None, strict=True) is DEFAULT


def test_the_guides_limit_rows_are_all_served() -> None:
    guide = GUIDE.read_text()
    block = re.search(r"```csv\n(.*?)```", guide, re.S)
    assert block, "the migration guide's counters-file example is gone"
    counters = resolve_counters(block.group(1), "guide")
    assert counters.errors == () and counters.unserved == ()
    served = {family.name for family in counters.selection.families}
    file_only = {field.name for field in FIELDS} - {field.name for field in DEFAULT_FIELDS}
    assert file_only <= served


# -- rendering a selection ----------------------------------------------------------------------


def _tick(timestamp: float) -> SeriesSet:
    gpu = (("gpu", "0"), ("uuid", "GPU-a"))
    info = (
        *gpu,
        ("model", "NVIDIA H200"),
        ("pci_bus_id", "0000:3b:00.0"),
        ("architecture", "hopper"),
        ("compute_capability", "9.0"),
        ("driver_version", "570.124.06"),
    )
    rows = (
        series("gpu_up", 1.0, gpu),
        series("gpu_info", 1.0, info),
        series("gpu_temperature_celsius", 61.0, (*gpu, ("sensor", "gpu"))),
        series("gpu_clock_max_hertz", 1.98e9, (*gpu, ("clock", "sm"))),
        series("gpu_power_management_limit_max_watts", 700.0, gpu),
    )
    families: dict[str, tuple[Series, ...]] = {}
    for row in rows:
        families[row.family] = (*families.get(row.family, ()), row)
    return SeriesSet(timestamp, families)


def test_a_selection_is_written_under_the_files_names_types_and_help() -> None:
    text = (
        "dcgm_gpu_temp, counter, legacy\\name\n"
        "DCGM_FI_DEV_MAX_SM_CLOCK, gauge, Max SM (in MHz).\n"
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX, gauge, Max limit (in W).\n"
        "DCGM_FI_DEV_MAX_MEM_CLOCK, gauge, no memory max in this tick\n"
        "DCGM_FI_DEV_NAME, label, model\n"
    )
    counters = resolve_counters(text, "c.csv")
    assert counters.errors == () and counters.unserved == ()
    out = render(_tick(2.0), None, ("hostname", "node-a"), counters.selection).decode()
    prefix = (
        'gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",device="nvidia0",'
        'modelName="NVIDIA H200",hostname="node-a",DCGM_FI_DEV_NAME="NVIDIA H200"'
    )
    assert out == (
        "# HELP DCGM_FI_DEV_MAX_SM_CLOCK Max SM (in MHz).\n"
        "# TYPE DCGM_FI_DEV_MAX_SM_CLOCK gauge\n"
        f"DCGM_FI_DEV_MAX_SM_CLOCK{{{prefix}}} 1980\n"
        "# HELP dcgm_gpu_temp legacy\\\\name\n"
        "# TYPE dcgm_gpu_temp counter\n"
        f"dcgm_gpu_temp{{{prefix}}} 61\n"
        "# HELP DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX Max limit (in W).\n"
        "# TYPE DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX gauge\n"
        f"DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX{{{prefix}}} 700.000000\n"
    )  # no DCGM_FI_DEV_MAX_MEM_CLOCK: the GPU gave no memory maximum, so no series, not 0


def test_a_file_naming_the_default_rows_renders_the_default_output() -> None:
    """The default selection is the file of its own rows: same bytes either way."""
    lines = [f'{field.name}, {field.type},"{field.help}"' for field in DEFAULT_FIELDS]
    lines.append("DCGM_FI_DRIVER_VERSION, label, Driver Version")
    counters = resolve_counters("\n".join(reversed(lines)) + "\n", "all.csv")
    assert counters.errors == () and counters.unserved == ()
    assert [(f.name, f.type, f.help) for f in counters.selection.families] == [
        (f.name, f.type, f.help) for f in DEFAULT.families
    ]
    hostname = ("hostname", "node-a")
    assert render(_tick(2.0), None, hostname, counters.selection) == render(
        _tick(2.0), None, hostname
    )


def test_families_are_built_from_the_rows_of_the_mapping_table() -> None:
    counters = resolve_counters("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, bits\n", "c.csv")
    (family,) = counters.selection.families
    assert family == Family(BY_NAME["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"],
                            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "bits")  # fmt: skip
