"""The metrics profile (gpu_exporter/model/profile.py, `metrics:`) on the built-in scenarios, run
as `serve --simulate` runs them (tests/scenario_runs.py):

- the default profile exports no more series on the 8-GPU `mixed` node than /metrics/dcgm
  (dcgm-exporter's default output) of the same node in the same run, through 20 minutes of
  alerts going pending and firing; the full profile exports more (what the default saves);
- every selector of the shipped alerting and recording rules and of the dashboards' queries and
  variables matches a series of the default profile in some scenario (the health ones where
  things break: `faults`; the fallbacks for drivers without throttle-time counters on such a
  driver);
- no series of the default profile has more than 12 labels;
- gpu_exporter_series says how many series each exported family has;
- the rules see exactly what /metrics exports (so they fire as in Prometheus), the JSON API and
  the status page everything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.config.load import ConfigError, load_config
from gpu_exporter.model.default_profile import DEFAULT
from gpu_exporter.model.nvml_facts import CLOCK_EVENT_REASONS
from gpu_exporter.model.profile import ExportFilter, series_counts, unknown_families
from gpu_exporter.model.series import Series as SeriesRow
from gpu_exporter.model.series import SeriesSet, series
from gpu_exporter.model.snapshot import DeviceSample
from gpu_exporter.pipeline.assembly import Assembly
from gpu_exporter.sim.scenario import builtin_path, builtin_scenarios
from gpu_exporter.web.api import create_app
from tests.scenario_runs import running
from tests.test_dashboards import (
    label_values,
    load,
    parse_with_variables,
    queries,
    recording_rules,
    selectors,
)

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "rules").glob("*.yaml"))
DASHBOARDS = sorted(path.name for path in (ROOT / "dashboards").glob("*.json"))
# Series no exporter writes: Prometheus' own (the scrape's `up`, the alerts' state).
NOT_EXPORTED = {"up", "ALERTS", "ALERTS_FOR_STATE"}
MAX_LABELS = 12
TICKS = 60  # 5 minutes of scenario time at 5 s: the faults scenario's XIDs and lost GPU in it

Series = tuple[str, tuple[tuple[str, str], ...]]


def samples(text: str) -> list[Series]:
    return [
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


# --- what the default profile costs -------------------------------------------------------------


def test_the_default_profile_exports_fewer_series_than_dcgm_exporter_on_mixed() -> None:
    """Measured every 100 s of scenario time for 20 minutes, as the rule pack's alerts go
    pending and fire (gpu_exporter_alerts), against /metrics/dcgm of the same tick."""
    flags = {"dcgm_compat.enabled": True}
    with running("mixed", flags) as run:
        for _ in range(12):
            run.tick(20)
            metrics, compat = count(run.metrics()), count(run.compat())
            assert 0 < metrics <= compat, f"t={run.clock():.0f}s: {metrics} series > {compat}"
    with running("mixed", {**flags, "metrics.profile": "full"}) as run:
        run.tick(20)
        assert count(run.metrics()) > 2 * count(run.compat())


# --- the default profile carries what the shipped rules and dashboards read --------------------


def variant(tmp_path: Path, builtin: str, name: str, change: Callable[[dict], None]) -> Path:
    """A copy of a built-in scenario, changed by `change` (its YAML as a mapping)."""
    spec = yaml.safe_load(builtin_path(builtin).read_text())
    change(spec)
    spec["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def without_throttle_counters(spec: dict) -> None:
    """A driver without any throttle-time counter (neither the per-reason fields nor
    nvmlDeviceGetViolationStatus): the rules' fallbacks on gpu_clock_event_active read it."""
    driver = spec["driver"]
    driver["missing_functions"] = [*driver["missing_functions"], "nvmlDeviceGetViolationStatus"]
    counters = [r.counter_field for r in CLOCK_EVENT_REASONS if r.counter_field is not None]
    driver["unsupported_fields"] = sorted({*driver["unsupported_fields"], *counters})


def more_faults(spec: dict) -> None:
    """The warning XIDs (61, 94) and memory repairs (remapped rows, retired pages) too."""
    spec["faults"] += [
        {"at": 20, "device": 0, "kind": "xid", "xid": 94},
        {"at": 22, "device": 0, "kind": "xid", "xid": 61},
    ]
    spec["devices"][0].setdefault("values", {}).update(
        {"remapped_rows_correctable": 2, "retired_pages_sbe": 1}
    )


def failing_collector(assembly: Assembly) -> None:
    def fail(devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        raise RuntimeError("broken on purpose")

    assembly.sampler.add_processor("broken", fail)


@pytest.fixture(scope="module")
def default_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[Series]]:
    """Run -> every series its /metrics had in the default profile, tick after tick: each
    built-in scenario, and the cases the shipped readers have selectors for that no built-in
    scenario has (an old driver, more faults, an exporter in trouble: a collector failing, an
    Alertmanager unreachable, DCGM configured by hand)."""
    tmp = tmp_path_factory.mktemp("sim")
    runs: list[tuple[str, str | Path, dict[str, Any], Callable[[Assembly], None]]] = [
        (name, name, {}, lambda _: None) for name in builtin_scenarios()
    ]
    runs += [
        ("old-driver", variant(tmp, "pre-hopper", "old-driver", without_throttle_counters), {},
         lambda _: None),
        ("more-faults", variant(tmp, "faults", "more-faults", more_faults), {}, lambda _: None),
        (
            "exporter-trouble",
            "pre-hopper-dcgm",
            {"dcgm.mode": "embedded", "alerting.alertmanagers": ["http://127.0.0.1:9/"]},
            failing_collector,
        ),
    ]  # fmt: skip
    outputs: dict[str, set[Series]] = {}
    for name, scenario, flags, prepare in runs:
        seen: set[Series] = set()
        with running(scenario, flags, prepare=prepare) as run:
            for _ in range(TICKS):
                run.tick()
                seen.update(samples(run.metrics()))
        outputs[name] = seen
    return outputs


def rule_exprs() -> Iterator[tuple[str, str]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                yield f"{path.name}: {name}", rule["expr"]


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    for query in queries(tuple(DASHBOARDS)):
        yield str(query), query.expr
    for name in DASHBOARDS:
        for variable in load(name)["templating"]["list"]:
            if variable["type"] == "query":
                selector, _ = label_values(variable["query"])
                yield f"{name} / variable {variable['name']}", selector


def reader_selectors() -> list[tuple[str, str, tuple[tuple[str, str, str], ...]]]:
    """(where, metric, matchers) of every selector of an exporter metric the shipped rules and
    dashboards read; Grafana's variables match anything."""
    recorded = set(recording_rules())
    found = []
    for where, expr in [*rule_exprs(), *dashboard_exprs()]:
        for selector in selectors(parse_with_variables(expr)):
            name = selector.name
            if not name or name in recorded or name in NOT_EXPORTED:
                continue
            matchers = tuple(
                (m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in selector.matchers.matchers
            )
            found.append((where, name, matchers))
    return found


_OPS = {
    "Equal": lambda value, want: value == want,
    "NotEqual": lambda value, want: value != want,
    "Re": lambda value, want: re.fullmatch(want, value) is not None,
    "NotRe": lambda value, want: re.fullmatch(want, value) is None,
}


def matches(series: Series, name: str, matchers: tuple[tuple[str, str, str], ...]) -> bool:
    sample, labels = series
    if sample != name:
        return False
    values = dict(labels)
    return all(_OPS[op](values.get(label, ""), want) for label, op, want in matchers)


def test_the_readers_selectors_are_found() -> None:
    """The walk below sees the rules' and dashboards' selectors (not an empty list)."""
    found = reader_selectors()
    names = {name for _, name, _ in found}
    assert {"gpu_up", "gpu_bottleneck", "gpu_clock_event_seconds_total"} <= names
    assert any(where.startswith("gpu-health.json") for where, _, _ in found)
    assert any("recording" in where for where, _, _ in found)


def test_every_selector_of_the_rules_and_dashboards_matches_the_default_profile(
    default_outputs: dict[str, set[Series]],
) -> None:
    everything = set().union(*default_outputs.values())
    unmatched = sorted(
        {
            f"{where}: {name}{{{', '.join(f'{label}{op}{v!r}' for label, op, v in matchers)}}}"
            for where, name, matchers in reader_selectors()
            if not any(matches(series, name, matchers) for series in everything)
        }
    )
    assert not unmatched, "selectors matching nothing in the default profile:\n" + "\n".join(
        unmatched
    )


def test_no_series_of_the_default_profile_has_more_than_12_labels(
    default_outputs: dict[str, set[Series]],
) -> None:
    wide = sorted(
        f"{scenario}: {name}{dict(labels)}"
        for scenario, seen in default_outputs.items()
        for name, labels in seen
        if len(labels) > MAX_LABELS
    )
    assert not wide, "\n".join(wide[:20])


def test_the_selector_check_sees_a_family_left_out() -> None:
    series: set[Series] = {("gpu_up", (("gpu", "0"),)), ("gpu_clock_event_active", ())}
    assert matches(("gpu_up", (("gpu", "0"),)), "gpu_up", (("gpu", "Re", ".*"),))
    assert not any(
        matches(s, "gpu_clock_event_active", (("reason", "Equal", "hw_slowdown"),)) for s in series
    )
    assert not any(matches(s, "gpu_pipe_active_ratio", ()) for s in series)


# --- gpu_exporter_series -------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["default", "full"])
def test_gpu_exporter_series_counts_every_exported_family(profile: str) -> None:
    with running("mixed", {"metrics.profile": profile}) as run:
        run.tick(3)
        text = run.metrics()
    exposed: dict[str, int] = {}
    reported: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        exposed[name] = len(family.samples)
        if family.name == "gpu_exporter_series":
            reported = {s.labels["family"]: s.value for s in family.samples}
    assert reported == exposed


# --- who sees what ------------------------------------------------------------------------------

SEEN_RULES = """\
groups:
  - name: seen
    rules:
      - alert: UpSeen
        expr: count(gpu_up) > 0
      - alert: PipesSeen
        expr: count(gpu_pipe_active_ratio) > 0
"""


def firing(text: str) -> set[str]:
    return {
        dict(labels)["alertname"]
        for name, labels in samples(text)
        if name == "gpu_exporter_alerts" and dict(labels).get("state") == "firing"
    }


@pytest.mark.parametrize(
    ("profile", "fired"), [("default", {"UpSeen"}), ("full", {"UpSeen", "PipesSeen"})]
)
def test_the_rules_see_what_metrics_exports(tmp_path: Path, profile: str, fired: set[str]) -> None:
    """gpu_pipe_active_ratio is full-only: a rule over it sees nothing in the default profile,
    as Prometheus scraping that /metrics would."""
    rules = tmp_path / "seen.yaml"
    rules.write_text(SEEN_RULES)
    flags = {"metrics.profile": profile, "rules.files": [str(rules)]}
    with running("mixed", flags) as run:
        run.tick(3)
        text = run.metrics()
    assert firing(text) == fired
    assert ("gpu_pipe_active_ratio" in {name for name, _ in samples(text)}) == (profile == "full")


def test_the_shipped_rules_read_nothing_the_default_profile_leaves_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with running("mixed"):
        pass
    assert not [r.getMessage() for r in caplog.records if "does not export" in r.getMessage()]


PARTIAL_RULES = """\
groups:
  - name: partial
    rules:
      - alert: MemoryClockRead
        expr: gpu_clock_hertz{clock="mem"} > 0
      - alert: ThermalFlagAlone
        expr: avg_over_time(gpu_clock_event_active{reason="hw_thermal_slowdown"}[1m]) > 0
      - alert: ThermalFlagWithItsCounter
        expr: |
          rate(gpu_clock_event_seconds_total{reason="hw_thermal_slowdown"}[1m]) > 0
          or (avg_over_time(gpu_clock_event_active{reason="hw_thermal_slowdown"}[1m]) > 0
              unless on (gpu) gpu_clock_event_seconds_total{reason="hw_thermal_slowdown"})
      - alert: SmClockRead
        expr: gpu_clock_hertz{clock="sm"} > 0
"""


def warned_rules(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """Rule name -> its start-up warning about reading what the profile leaves out."""
    found = {}
    for record in caplog.records:
        message = record.getMessage()
        if "does not export" in message:
            found[message.split()[1]] = message
    return found


def test_a_rule_reading_a_part_the_profile_leaves_out_is_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not only whole families: the memory clock (default exports the SM clock), and a reason
    flag read without the counter that replaces it where the driver has one."""
    rules = tmp_path / "partial.yaml"
    rules.write_text(PARTIAL_RULES)
    with running("mixed", {"rules.files": [str(rules)]}):
        pass
    warned = warned_rules(caplog)
    assert set(warned) == {"MemoryClockRead", "ThermalFlagAlone"}
    assert (
        'gpu_clock_hertz{clock="mem"} (does not export its clock="mem" series)'
        in (warned["MemoryClockRead"])
    )
    assert "only where gpu_clock_event_seconds_total has no series" in warned["ThermalFlagAlone"]
    caplog.clear()
    with running("mixed", {"rules.files": [str(rules)], "metrics.profile": "full"}):
        pass
    assert warned_rules(caplog) == {}


@pytest.mark.parametrize(
    ("family", "equal", "also_read", "why"),
    [
        ("gpu_utilization_ratio", {}, (), None),  # whole
        ("gpu_pipe_active_ratio", {}, (), "does not export it"),  # full only
        ("gpu_clock_hertz", {"clock": "sm"}, (), None),
        ("gpu_clock_hertz", {"clock": "mem"}, (), 'does not export its clock="mem" series'),
        ("gpu_clock_hertz", {}, (), None),  # all clocks asked: the SM clock is there
        ("gpu_clock_event_active", {"reason": "hw_thermal_slowdown"}, (), "only where"),
        (
            "gpu_clock_event_active",
            {"reason": "hw_thermal_slowdown"},
            ("gpu_clock_event_seconds_total",),
            None,
        ),
    ],
)
def test_what_a_selector_misses_in_the_default_profile(
    family: str, equal: dict[str, str], also_read: tuple[str, ...], why: str | None
) -> None:
    found = ExportFilter("default").unexported_read(family, equal, also_read)
    assert (found is None) if why is None else (found is not None and why in found)
    assert ExportFilter("full").unexported_read(family, equal, also_read) is None
    included = ExportFilter("default", include=[family])
    assert included.unexported_read(family, equal, also_read) is None


def test_the_api_and_the_status_page_see_every_family() -> None:
    """The status page reads /api/v1/devices, built from every series of the tick: the GPU's MIG
    mode and memory clock are there whatever the profile."""
    with running("mixed") as run:
        run.tick(2)
        exported = {name for name, _ in samples(run.metrics())}
        client = TestClient(create_app(run.assembly.sampler, lambda: True))
        device = client.get("/api/v1/devices").json()["data"]["devices"][0]
    assert "gpu_mig_mode" not in exported and "gpu_mig_mode" in device["metrics"]
    clocks = {entry["labels"]["clock"] for entry in device["metrics"]["gpu_clock_max_hertz"]}
    assert {"sm", "memory"} <= clocks


# --- the filter, series by series ----------------------------------------------------------------


def tick(*rows: SeriesRow) -> SeriesSet:
    families: dict[str, tuple[SeriesRow, ...]] = {}
    for row in rows:
        families[row.family] = (*families.get(row.family, ()), row)
    return SeriesSet(0.0, families)


def names(series_set: SeriesSet) -> list[tuple[str, dict[str, str], float]]:
    return [(row.name, dict(row.labels), row.value) for row in series_set]


GPU0 = (("gpu", "0"), ("uuid", "GPU-0"))


def test_the_default_profile_keeps_the_part_of_a_family_it_names() -> None:
    clocks = [series("gpu_clock_hertz", 1e9, (*GPU0, ("clock", c))) for c in ("sm", "memory")]
    pipes = series("gpu_pipe_active_ratio", 0.5, (*GPU0, ("pipe", "fp32")))
    exported = ExportFilter("default").apply(tick(*clocks, pipes, series("gpu_up", 1.0, GPU0)))
    assert names(exported) == [
        ("gpu_clock_hertz", {**dict(GPU0), "clock": "sm"}, 1e9),
        ("gpu_up", dict(GPU0), 1.0),
    ]


def test_a_clock_event_state_is_left_out_where_its_counter_measures_it() -> None:
    def active(reason: str) -> SeriesRow:
        return series("gpu_clock_event_active", 0.0, (*GPU0, ("reason", reason)))

    counted = series("gpu_clock_event_seconds_total", 3.0, (*GPU0, ("reason", "sw_power_cap")))
    rows = [active("sw_power_cap"), active("hw_slowdown"), active("gpu_idle"), counted]
    kept = names(ExportFilter("default").apply(tick(*rows)))
    assert [(name, labels["reason"]) for name, labels, _ in kept] == [
        ("gpu_clock_event_active", "hw_slowdown"),
        ("gpu_clock_event_seconds_total", "sw_power_cap"),
    ]
    assert len(list(ExportFilter("full").apply(tick(*rows)))) == 4


def test_a_quiet_series_is_exported_from_the_first_time_it_says_something() -> None:
    export = ExportFilter("default")

    def xids(count: float, *more: SeriesRow) -> list[float]:
        row = series("gpu_xid_errors_total", count, (*GPU0, ("xid", "79")))
        return [value for _, _, value in names(export.apply(tick(row, *more)))]

    assert xids(0.0) == []
    assert xids(2.0) == [2.0]
    assert xids(0.0) == [0.0]  # a driver reload set it back: still there, as Prometheus saw it
    assert xids(0.0, series("gpu_up", 1.0, GPU0)) == [0.0, 1.0]
    other = series("gpu_xid_errors_total", 1.0, (*GPU0, ("xid", "48")))
    export.apply(tick(other))  # XID 79's series went away (a pod's labels changed): forgotten
    assert xids(0.0) == []


def test_include_exports_a_family_whole_and_exclude_none_of_it() -> None:
    rows = [
        series("gpu_pipe_active_ratio", 0.5, (*GPU0, ("pipe", "fp32"))),
        series("gpu_clock_hertz", 1e9, (*GPU0, ("clock", "memory"))),
        series("gpu_up", 1.0, GPU0),
    ]
    export = ExportFilter("default", include=["gpu_pipe_active_ratio", "gpu_clock_hertz"])
    assert len(list(export.apply(tick(*rows)))) == 3
    export = ExportFilter("full", exclude=["gpu_up"])
    assert [name for name, _, _ in names(export.apply(tick(*rows)))] == [
        "gpu_pipe_active_ratio",
        "gpu_clock_hertz",
    ]
    with pytest.raises(ValueError, match="gpu_pipes"):
        ExportFilter("default", include=["gpu_pipes"])


def test_the_full_profile_hands_the_tick_on_as_it_is() -> None:
    series_set = tick(series("gpu_up", 1.0, GPU0))
    assert ExportFilter("full").apply(series_set) is series_set


def test_the_default_profile_names_catalog_families_only() -> None:
    assert not unknown_families(DEFAULT), "a misspelt family in the default profile"


def test_series_counts_count_each_family_and_themselves() -> None:
    counted = series_counts(tick(*(series("gpu_up", 1.0, (("gpu", str(i)),)) for i in range(3))))
    assert {dict(row.labels)["family"]: row.value for row in counted} == {
        "gpu_up": 3.0,
        "gpu_exporter_series": 2.0,
    }


# --- settings ------------------------------------------------------------------------------------


def test_an_unknown_family_is_an_error_naming_file_line_and_item(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("metrics:\n  include:\n    - gpu_up\n    - gpu_pipes\n")
    with pytest.raises(ConfigError, match=rf"{path}:4: metrics.include\[1\]: .*'gpu_pipes'"):
        load_config(str(path), {}, environ={})
    path.write_text("metrics:\n  include: [gpu_up]\n  exclude: [gpu_up]\n")
    with pytest.raises(ConfigError, match="gpu_up both in include and in exclude"):
        load_config(str(path), {}, environ={})


def test_the_profile_from_the_flag_the_environment_and_the_file(tmp_path: Path) -> None:
    assert load_config(None, {}, environ={}).metrics.profile == "default"
    assert load_config(None, {"metrics.profile": "full"}, environ={}).metrics.profile == "full"
    environ = {"GPU_EXPORTER_METRICS__INCLUDE": "gpu_pipe_active_ratio, gpu_mig_mode"}
    metrics = load_config(None, {}, environ=environ).metrics
    assert metrics.include == ("gpu_pipe_active_ratio", "gpu_mig_mode")
    with pytest.raises(ConfigError, match="--metrics-profile"):
        load_config(None, {"metrics.profile": "everything"}, environ={})
