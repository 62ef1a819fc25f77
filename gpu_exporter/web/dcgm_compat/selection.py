"""Which families and labels /metrics/dcgm writes: every default row of the mapping table
(fields.py), or the rows a dcgm-exporter counters file names, under its names, types and help.

A counters-file row is resolved as dcgm-exporter resolves it (NVIDIA/dcgm-exporter
internal/pkg/counters/counter_config.go, ExtractCounters): its name to a DCGM field id with
go-dcgm's `GetFieldID` (model/dcgm_field_names.py holds the names it knows), else to one of
dcgm-exporter's own `DCGM_EXP_*` counters (exporter_counters.go), else it is an error.
Here, then:

- a name no DCGM (nor dcgm-exporter) knows is an **error** naming the line, as there;
- a field of the mapping table (by id: an older alias or a dcgm-exporter 1.x name serves the
  same values) is **served**: a value row with the file's type and help, a `label` row as a
  label on every series;
- anything else dcgm-exporter knows but this output does not give — a field the daemon does
  not read, a `DCGM_EXP_*` counter, a string field typed as a value or a value typed `label`,
  a name given again (its first row is served), and DCGM 4.6's new names (dcgm-exporter 4.9
  serves them in other units, which this output, dcgm-exporter 4.8's, does not) — is **not
  served**: a warning naming the line, or with strict checking (`dcgm_compat.strict`,
  `config check --strict`) an error. dcgm-exporter skips DCP rows it cannot collect with a
  warning, too.

Families are written in dcgm-exporter's order: by field id, then name (its renderer ranges
over a map keyed by the counter, which Go's templates visit in sorted order); labels by name.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_exporter.support.yamlfile import YamlFileError, read_bounded
from gpu_exporter.web.dcgm_compat.counters_file import CounterRow, parse_counters
from gpu_exporter.web.dcgm_compat.fields import (
    BY_ID,
    BY_NAME,
    DEFAULT_FIELDS,
    DEFAULT_LABELS,
    LABEL_FIELDS,
    LABELS_BY_ID,
    NOT_CARRIED,
    CompatField,
    LabelField,
)

log = logging.getLogger(__name__)

# dcgm-exporter's own counters, which a counters file may name (counters/const.go).
EXPORTER_COUNTERS = (
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
)


@dataclass(frozen=True)
class Family:
    """One family of the output: `field` computes it, written as `name` with `type` and
    `help` (the mapping table's own, or a counters file's)."""

    field: CompatField
    name: str
    type: str
    help: str


@dataclass(frozen=True)
class Label:
    """A label on every series, `name="<the GPU's gpu_info label field.info>"`."""

    field: LabelField
    name: str


@dataclass(frozen=True)
class Selection:
    families: tuple[Family, ...]
    labels: tuple[Label, ...]  # in name order


DEFAULT = Selection(
    tuple(Family(field, field.name, field.type, field.help) for field in DEFAULT_FIELDS),
    tuple(Label(label, label.name) for label in DEFAULT_LABELS),
)


class CountersFileError(ValueError):
    """A counters file /metrics/dcgm cannot serve; one `path:line: message` per line."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class CountersFile:
    """A counters file resolved: what it selects, its errors and its rows not served, each
    problem as `path:line: message`."""

    selection: Selection
    errors: tuple[str, ...]
    unserved: tuple[str, ...]

    def problems(self, strict: bool) -> list[str]:
        """What stops the start: the errors, and with `strict` the rows not served."""
        return [*self.errors, *(self.unserved if strict else ())]


def read_counters_file(path: str) -> CountersFile:
    """The counters file at `path`, read and resolved (a file that cannot be read is one
    error)."""
    try:
        data = read_bounded(path)
    except YamlFileError as exc:  # its message names the file and why
        return CountersFile(DEFAULT, (str(exc),), ())
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return CountersFile(DEFAULT, (f"{path}:{line}: not UTF-8 text (byte {exc.start})",), ())
    return resolve_counters(text, path)


def resolve_counters(text: str, path: str) -> CountersFile:
    """A counters file's `text` resolved against the mapping table; `path` names it."""
    parsed = parse_counters(text, path)
    errors, unserved = list(parsed.errors), list(parsed.repeated)
    families: list[Family] = []
    labels: list[Label] = []
    for row in parsed.rows:
        served, problem, fatal = _resolve(row)
        if isinstance(served, Family):
            families.append(served)
        elif isinstance(served, Label):
            labels.append(served)
        else:
            (errors if fatal else unserved).append(f"{path}:{row.line}: {problem}")
    families.sort(key=lambda family: (family.field.field_id, family.name))
    labels.sort(key=lambda label: label.name)
    unserved.sort(key=_line)
    return CountersFile(Selection(tuple(families), tuple(labels)), tuple(errors), tuple(unserved))


def _line(problem: str) -> int:
    """The line a `path:line: message` names (paths may hold colons: counted from the end of
    the path, which the message starts after)."""
    head = problem.split(": ", 1)[0]
    return int(head.rpartition(":")[2])


def load_selection(path: str | None, strict: bool) -> Selection:
    """What `serve` writes: DEFAULT without a file; the file's selection, each row it does not
    serve logged once as a warning; CountersFileError for what stops the start."""
    if path is None:
        return DEFAULT
    counters = read_counters_file(path)
    problems = counters.problems(strict)
    if problems:
        raise CountersFileError(problems)
    for warning in counters.unserved:
        log.warning("%s: not served on /metrics/dcgm (dcgm_compat.strict: an error)", warning)
    return counters.selection


def _resolve(row: CounterRow) -> tuple[Family | Label | None, str, bool]:
    """What the row serves, or (None, why not, whether that is an error)."""
    from gpu_exporter.model.dcgm_field_names import DCGM_EXPORTER_4_8, LATER

    name = row.name
    field_id = DCGM_EXPORTER_4_8.get(name)
    if field_id is not None:
        return _served(row, field_id)
    if name in EXPORTER_COUNTERS:
        return None, f"{name}: {NOT_CARRIED.get(name, 'dcgm-exporter counter')}", False
    if name in LATER:
        return None, _later(name, LATER[name]), False
    return None, _unknown(name), True


def _served(row: CounterRow, field_id: int) -> tuple[Family | Label | None, str, bool]:
    name, label = row.name, LABELS_BY_ID.get(field_id)
    field = BY_NAME.get(name) or BY_ID.get(field_id)  # a row of its own, else its id's
    if row.type == "label":
        if label is not None:
            return Label(label, name), "", False
        known = ", ".join(label.name for label in LABEL_FIELDS)
        what = "a number" if field is not None else "a field the daemon does not read"
        return None, f"{name}: a label row, but the field is {what}; labels: {known}", False
    if label is not None:
        return None, f"{name}: a string, which dcgm-exporter can only use as a label row", False
    if field is None:
        why = NOT_CARRIED.get(name, "the daemon does not read it")
        return None, f"{name} (DCGM field {field_id}): {why}", False
    return Family(field, name, row.type, row.help), "", False


def _later(name: str, field_id: int) -> str:
    served = BY_ID.get(field_id) or LABELS_BY_ID.get(field_id)
    instead = (
        f"name it {served.name} (in its units)"
        if served is not None
        else "the daemon does not serve that field under any name"
    )
    return (
        f"{name}: DCGM 4.6's name for field {field_id}, which dcgm-exporter 4.9 writes in "
        f"other units; /metrics/dcgm follows dcgm-exporter 4.8: {instead}"
    )


def _unknown(name: str) -> str:
    message = f"unknown DCGM field {name!r}"
    if name.startswith("#"):
        return f"{message}: a comment's # must be the line's first character"
    known = [*BY_NAME, *(label.name for label in LABEL_FIELDS)]
    close = difflib.get_close_matches(name, known, n=1)
    return f"{message}; did you mean {close[0]}?" if close else message
