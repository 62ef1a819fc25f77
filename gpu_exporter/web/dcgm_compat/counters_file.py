"""dcgm-exporter's counters file (its `-f/--collectors` CSV): one row per family, `DCGM field,
Prometheus type, help text`, read as dcgm-exporter reads it. This module reads the format only;
which rows /metrics/dcgm can serve is selection.py's job.

dcgm-exporter reads the file with Go's encoding/csv, `Comment = '#'`, then checks each record
(NVIDIA/dcgm-exporter internal/pkg/counters/counter_config.go: ReadCSVFile, ExtractCounters;
variables.go: promMetricType). So, here as there:

- a line whose first character is `#` is a comment, and an empty line is skipped;
- fields are separated by commas; a field whose first character is `"` is quoted and may hold
  commas, line breaks and `""` (one quote); a quote in a field not quoted so is an error, and
  so is anything but a comma or the line's end after a closing quote (encoding/csv's
  ErrBareQuote and ErrQuote: `DCGM_FI_X, gauge, "a, b"` is one, because of the space before
  the quote);
- every field is trimmed of spaces (`strings.Trim(r, " ")`: spaces, not tabs);
- a row has exactly three fields;
- the type is spelled as in `promMetricType`, lower case.

Where this reader differs, on purpose, it reports every problem with its line where
dcgm-exporter stops at the first, and:
- a line of spaces only is skipped (encoding/csv reads it as a one-field row, which
  dcgm-exporter refuses), and so is a UTF-8 byte-order mark at the start;
- `histogram` and `summary` are refused: a DCGM field is one number, which dcgm-exporter
  writes under that `# TYPE` line as a lone sample, a family no Prometheus client reads as
  such.

And it reports, rather than writes:
- a name given twice is served once, from its first row, and the later row is reported
  (`ParsedFile.repeated`; selection.py makes that a warning, or with strict checking an
  error): dcgm-exporter writes the family twice, a text exposition with a family twice is
  invalid, and Prometheus keeps one of the two samples anyway. dcgm-exporter's own
  `1.x-compatibility-metrics.csv` names its PCIe byte fields twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# The Prometheus types a row may give, and the ones dcgm-exporter accepts that are refused.
TYPES = ("gauge", "counter", "label")
_NOT_ONE_VALUE = ("histogram", "summary")
_COLUMNS = "DCGM field, Prometheus type, help text"


@dataclass(frozen=True)
class CounterRow:
    """One row of the file, its fields trimmed; `line` is where the row starts."""

    line: int
    name: str
    type: str  # one of TYPES
    help: str


@dataclass(frozen=True)
class ParsedFile:
    """The rows read, each problem as `path:line: message` (rows with one are left out), and
    each row naming a field an earlier row names, so (left out too)."""

    rows: tuple[CounterRow, ...]
    errors: tuple[str, ...]
    repeated: tuple[str, ...] = ()


def parse_counters(text: str, path: str) -> ParsedFile:
    """The rows of a counters file's `text`; `path` names it in the errors."""
    rows: list[CounterRow] = []
    errors: list[str] = []
    repeated: list[str] = []
    first_line: dict[str, int] = {}
    for line, record in _records(text.removeprefix("\ufeff")):
        problem = record if isinstance(record, str) else _problem(record)
        if isinstance(record, str) or problem:
            errors.append(f"{path}:{line}: {problem}")
            continue
        name, type_, help_ = (field.strip(" ") for field in record)
        if name in first_line:
            first = first_line[name]
            repeated.append(f"{path}:{line}: {name} is already on line {first}, which is served")
            continue
        first_line[name] = line
        rows.append(CounterRow(line, name, type_, help_))
    if not rows and not errors:
        errors.append(f"{path}: no rows ({_COLUMNS}): every line is blank or a comment")
    return ParsedFile(tuple(rows), tuple(errors), tuple(repeated))


def _problem(record: list[str]) -> str:
    """What is wrong with a record (its fields untrimmed), or ""."""
    if len(record) != 3:
        return f"expected 3 fields ({_COLUMNS}), found {len(record)}"
    name, type_, _ = (field.strip(" ") for field in record)
    if not name:
        return "the DCGM field (first column) is empty"
    if type_ in _NOT_ONE_VALUE:
        return f"{name}: a DCGM field is one value, not a {type_}: use gauge or counter"
    if type_ not in TYPES:
        return f"{name}: unknown Prometheus type {type_!r}: expected gauge, counter or label"
    return ""


def _records(text: str) -> Iterator[tuple[int, list[str] | str]]:
    """(the line a record starts on, its fields or what is wrong with it), as encoding/csv
    reads them: comments and empty lines skipped, quoted fields across lines joined."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#") or not line.strip(" "):
            index += 1
            continue
        start = index + 1
        record, index = _record(lines, index)
        yield start, record


def _record(lines: list[str], index: int) -> tuple[list[str] | str, int]:
    """The record starting on `lines[index]` (fields, or what is wrong), and the index of the
    line after it."""
    fields: list[str] = []
    line, pos = lines[index], 0
    while True:
        if line.startswith('"', pos):
            parts, pos = [], pos + 1
            while True:
                quote = line.find('"', pos)
                if quote < 0:  # the field goes on on the next line
                    parts += [line[pos:], "\n"]
                    index += 1
                    if index == len(lines):
                        return "a quoted field is never closed (a missing closing quote)", index
                    line, pos = lines[index], 0
                    continue
                parts.append(line[pos:quote])
                if line.startswith('"', quote + 1):  # "" is one quote
                    parts.append('"')
                    pos = quote + 2
                    continue
                pos = quote + 1
                break
            fields.append("".join(parts))
            if pos == len(line):
                return fields, index + 1
            if line[pos] != ",":
                return (
                    f"column {pos + 1}: a closing quote must be followed by a comma or the "
                    "line's end",
                    index + 1,
                )
            pos += 1
            continue
        comma = line.find(",", pos)
        field = line[pos:] if comma < 0 else line[pos:comma]
        if '"' in field:
            column = pos + 1 + field.index('"')
            return (
                f"column {column}: a quote in a field that is not quoted: to quote a field "
                '(e.g. a help text with commas), start it with " right after the comma, with '
                "no space before it",
                index + 1,
            )
        fields.append(field)
        if comma < 0:
            return fields, index + 1
        pos = comma + 1
