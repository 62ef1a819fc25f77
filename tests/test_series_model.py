"""The one series model: the rule store holds exactly what a scrape returns, and a producer
that breaks loses only its own families for that tick."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.store import Matcher
from gpu_exporter.model.guard import Guard
from gpu_exporter.model.series import Producer, Series, SeriesBuilder, series
from gpu_exporter.model.snapshot import DeviceSample, Reading, Snapshot
from gpu_exporter.pipeline.assembly import Assembly
from gpu_exporter.web.exposition import RenderedMetrics
from tests.golden_exposition import MODES, TICKS, running

Sample = tuple[str, tuple[tuple[str, str], ...], str]


def scraped(text: str) -> set[Sample]:
    """Every sample of an exposition, as Prometheus' parser reads it (empty labels dropped)."""
    out = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if v != ""))
            out.add((sample.name, labels, repr(sample.value)))
    return out


def stored(manager: RuleManager, t: float) -> set[Sample]:
    """Every series the rule store holds with a sample at exactly `t`."""
    out = set()
    for labels, samples in manager.store.select_latest([Matcher("__name__", "=~", ".+")], t):
        (sample_t, value) = samples[0]
        if sample_t != t or math.isnan(value):
            continue
        name = dict(labels)["__name__"]
        rest = tuple((k, v) for k, v in labels if k != "__name__")
        out.add((name, rest, repr(float(value))))
    return out


def keep_everything(assembly: Assembly) -> None:
    """The store normally keeps only what some rule reads; here it must keep every series."""
    manager = assembly.rules
    assert manager is not None
    original = manager.store.configure
    manager.store.configure = lambda retention, _names, by_name=None: original(  # type: ignore[method-assign]
        retention, None, by_name
    )
    manager.store.configure(manager.store.retention, None)


@pytest.mark.parametrize(
    ("mode", "profile", "least"),
    [*((mode, "default", 400) for mode in MODES), ("labels", "full", 1000)],
)
def test_the_rule_store_holds_exactly_what_a_scrape_returns(
    mode: str, profile: str, least: int
) -> None:
    """In every metrics profile: the rules see what the profile exports, no more, no less."""
    with running(mode, keep_everything, profile) as assembly:
        sampler, manager = assembly.sampler, assembly.rules
        assert sampler.rendered is not None and sampler.latest is not None and manager
        exposed = scraped(sampler.rendered.text.decode())
        in_store = stored(manager, sampler.latest.timestamp)
    assert len(exposed) > least
    only_scraped, only_stored = exposed - in_store, in_store - exposed
    assert not only_scraped and not only_stored, (
        f"scraped only: {sorted(only_scraped)[:10]}\nstored only: {sorted(only_stored)[:10]}"
    )
    if mode == "labels":  # the case that used to differ: gpu_up / gpu_info with pod labels
        assert any(
            name == "gpu_up" and ("pod", "trainer-0") in labels for name, labels, _ in exposed
        )


# -- guarded producers ------------------------------------------------------------------------


class Breaks:
    """A producer that raises on chosen ticks."""

    def __init__(self) -> None:
        self.broken = True
        self.calls = 0

    def series(self) -> Iterator[Series]:
        self.calls += 1
        if self.broken:
            raise RuntimeError("collector bug")
        yield series("gpu_exporter_attribution_up", 1.0)


def exposition(assembly: Assembly) -> str:
    assert assembly.sampler.rendered is not None
    return assembly.sampler.rendered.text.decode()


def test_a_producer_that_raises_loses_only_its_own_families(
    caplog: pytest.LogCaptureFixture,
) -> None:
    breaks = Breaks()

    def add(assembly: Assembly) -> None:
        assembly.sampler.add_producer(
            Producer("kubernetes", breaks.series, frozenset({"kubernetes"}))
        )

    caplog.set_level(logging.ERROR, logger="gpu_exporter.model.guard")
    with running("off", add, "full") as assembly:
        text = exposition(assembly)
        assert 'gpu_exporter_collector_success{collector="kubernetes"} 0.0' in text
        assert "gpu_exporter_attribution_up" not in text
        assert 'gpu_exporter_collector_success{collector="exporter"} 1.0' in text
        assert text.count("gpu_up{") == 8 and "gpu_sm_active_ratio{" in text
        assert "gpu_exporter_ticks_total 6.0" in text  # published every tick regardless
        failures = [r for r in caplog.records if "collector kubernetes failed" in r.getMessage()]
        assert breaks.calls == 6 and len(failures) == 1, "logged once per distinct error"
        breaks.broken = False  # the next tick has its families again
        assembly.sampler.tick()
        text = exposition(assembly)
        assert 'gpu_exporter_collector_success{collector="kubernetes"} 1.0' in text
        assert "gpu_exporter_attribution_up 1.0" in text


def test_a_processor_that_raises_costs_its_enrichment_not_the_telemetry() -> None:
    def broken(devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        raise ValueError("classifier bug")

    def add(assembly: Assembly) -> None:
        assembly.sampler._processors = [("classifier", broken)]  # replaces the real one

    with running("off", add, "full") as assembly:
        text = exposition(assembly)
    assert 'gpu_exporter_collector_success{collector="classifier"} 0.0' in text
    assert "gpu_bottleneck{" not in text
    assert "gpu_utilization_ratio{" in text and "gpu_exporter_alerts{" in text


def test_rule_evaluation_and_rule_metrics_that_raise_are_reported() -> None:
    def add(assembly: Assembly) -> None:
        manager = assembly.rules
        assert manager is not None

        def broken_evaluation(_series: object) -> None:
            raise RuntimeError("evaluator bug")

        def broken_metrics() -> Iterable[Series]:
            raise RuntimeError("metrics bug")

        manager.on_series = broken_evaluation  # type: ignore[method-assign]
        manager.series = broken_metrics  # type: ignore[method-assign]

    with running("off", add, "full") as assembly:
        text = exposition(assembly)
    assert 'gpu_exporter_collector_success{collector="rule_evaluation"} 0.0' in text
    assert 'gpu_exporter_collector_success{collector="rules"} 0.0' in text
    assert "gpu_exporter_alerts" not in text and "gpu_exporter_rule_evaluations_total" not in text
    assert "gpu_power_watts{" in text and "gpu_exporter_ticks_total 6.0" in text


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (Series("gpu_not_in_catalog", "gpu_not_in_catalog", (), 1.0), "unknown family"),
        (series("gpu_exporter_alerts", 1.0, (("severity", "x"),)), "not in the catalog"),
        (series("gpu_exporter_alerts", 1.0, (("alertname", 5),)), "not a string"),  # type: ignore[arg-type]
        (series("gpu_exporter_rule_evaluations_total", None), "not a number"),  # type: ignore[arg-type]
        (series("gpu_power_watts", 1.0, (("gpu", "0"), ("uuid", "u"))), "may emit"),
        (series("gpu_exporter_notifications_queue_length", 1.0), "may emit"),
        (series("gpu_exporter_rule_reload_success", 0.0), "emitted twice"),
        (
            Series(
                "gpu_exporter_rule_reload_failures_total",
                "gpu_exporter_rule_reload_failures",
                (),
                1.0,
            ),
            "sample name",
        ),
    ],
)
def test_series_that_the_catalog_does_not_declare_are_refused(
    bad: Series, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Self-metrics take names, types and labels from the catalog; a slip costs that series
    (not the producer's others, nor the tick), marks the producer failed and says why."""
    good = series("gpu_exporter_rule_reload_success", 1.0)
    snapshot = Snapshot(
        1.0, (DeviceSample(0, "GPU-a", {}, True, (Reading("gpu_power_watts", 5),)),)
    )
    caplog.set_level(logging.ERROR, logger="gpu_exporter.model.guard")
    result = SeriesBuilder().build(
        snapshot, [Producer("rules", lambda: [good, bad], frozenset({"rules"}))]
    )
    assert result.of("gpu_exporter_rule_reload_success") == (good,)
    assert bad not in set(result)
    assert result.of("gpu_power_watts") and result.of("gpu_up")
    assert {s.collector: s.success for s in result.collectors}["rules"] is False
    assert why in caplog.text


def test_a_reading_of_an_unknown_family_costs_only_that_reading() -> None:
    readings = (Reading("gpu_bogus", 1), Reading("gpu_power_watts", 5))
    snapshot = Snapshot(1.0, (DeviceSample(0, "GPU-a", {}, True, readings),))
    result = SeriesBuilder().build(snapshot)
    assert {s.collector: s.success for s in result.collectors}["devices"] is False
    assert "gpu_bogus" not in result.names()
    assert result.of("gpu_power_watts") and result.of("gpu_exporter_build_info")


def test_the_error_log_is_bounded_however_many_distinct_errors() -> None:
    guard = Guard()
    for n in range(5000):
        guard.report("x", f"error number {n}")
    assert len(guard._logged) == 1000


def test_bad_values_and_label_values_cost_only_their_reading() -> None:
    readings = (
        Reading("gpu_power_watts", None),  # type: ignore[arg-type]
        Reading("gpu_temperature_celsius", 40.0, (("sensor", 1),)),  # type: ignore[arg-type]
        Reading("gpu_power_limit_watts", 700),  # an int is a number: kept, as a float
    )
    other = DeviceSample(1, "GPU-b", {}, True, (Reading("gpu_power_watts", 9.0),))
    snapshot = Snapshot(1.0, (DeviceSample(0, "GPU-a", {}, True, readings), other))
    result = SeriesBuilder().build(snapshot)
    assert {s.collector: s.success for s in result.collectors}["devices"] is False
    assert [r.labels for r in result.of("gpu_power_watts")] == [(("gpu", "1"), ("uuid", "GPU-b"))]
    assert not result.of("gpu_temperature_celsius")
    assert result.of("gpu_power_limit_watts")[0].value == 700.0
    assert len(result.of("gpu_up")) == 2
    RenderedMetrics(result)  # and what is left renders


def test_a_pod_labels_source_that_raises_costs_the_pod_labels_not_the_tick() -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("attribution bug")

    with running("off", lambda assembly: assembly.sampler.set_device_labels(broken)) as assembly:
        text = exposition(assembly)
    assert 'gpu_exporter_collector_success{collector="pod_labels"} 0.0' in text
    assert "gpu_exporter_ticks_total 6.0" in text and 'gpu_up{gpu="0",uuid=' in text


def test_a_failed_late_ingest_is_reported_by_the_next_tick() -> None:
    calls = {"n": 0}

    def add(assembly: Assembly) -> None:
        manager = assembly.rules
        assert manager is not None
        original = manager.on_late_series

        def flaky(series_set: object) -> None:
            calls["n"] += 1
            if calls["n"] == TICKS - 1:  # the tick before the last
                raise RuntimeError("store bug")
            original(series_set)  # type: ignore[arg-type]

        manager.on_late_series = flaky  # type: ignore[method-assign]

    with running("off", add, "full") as assembly:
        text = exposition(assembly)
        assert 'gpu_exporter_collector_success{collector="rule_evaluation"} 0.0' in text
        assembly.sampler.tick()
        assert 'collector="rule_evaluation"} 1.0' in exposition(assembly)
        assert any(s.collector == "rule_evaluation" for s in assembly.sampler.series.collectors)  # type: ignore[union-attr]


def test_when_the_whole_source_fails_every_collector_says_so() -> None:
    def add(assembly: Assembly) -> None:
        assembly.sampler.tick()  # learn the collectors
        assembly.sampler.source.sample = broken  # type: ignore[method-assign]

    def broken() -> list[DeviceSample]:
        raise RuntimeError("source bug")

    with running("off", add, "full") as assembly:
        text = exposition(assembly)
    for collector in ("nvml", "clocks", "memory", "gpm", "topology"):
        assert f'gpu_exporter_collector_success{{collector="{collector}"}} 0.0' in text
    assert text.count("gpu_up{") == 8 and 'gpu_up{gpu="0",uuid=' in text
    assert all(line.endswith(" 0.0") for line in text.splitlines() if line.startswith("gpu_up{"))


def test_pod_info_and_pod_labels_come_from_one_kubelet_answer() -> None:
    from gpu_exporter.collect.k8s.attribution import AttributionSnapshot, PodRef
    from gpu_exporter.collect.k8s.labels import PodsOfTick

    class Attribution:
        def __init__(self) -> None:
            self.answer = {"GPU-a": (PodRef("ml", "old", "c"),)}

        def snapshot(self) -> AttributionSnapshot:
            return AttributionSnapshot(self.answer, {})

    attribution = Attribution()
    pods = PodsOfTick(attribution)  # type: ignore[arg-type]
    devices = pods.process([DeviceSample(0, "GPU-a", {}, True)], 0.0)
    attribution.answer = {"GPU-a": (PodRef("ml", "new", "c"),)}  # a refresh lands mid-tick
    assert dict(pods.labels()["GPU-a"])["pod"] == "old"
    assert dict(devices[0].readings[0].labels)["pod"] == "old"


def test_two_unidentified_gpus_are_two_devices_each_with_its_own_readings() -> None:
    """A GPU whose UUID could not be read at start has none: its series carry only `gpu`, and
    two such GPUs must not pool their readings (nor their reasons) under the one empty UUID."""

    def unidentified(index: int, xids: float, why: str) -> DeviceSample:
        readings = (Reading("gpu_xid_errors_total", xids, (("xid", "79"),)),)
        return DeviceSample(index, "", {}, False, readings, why)

    snapshot = Snapshot(
        1.0,
        (
            DeviceSample(0, "GPU-a", {}, True, (Reading("gpu_power_watts", 100.0),)),
            unidentified(1, 1.0, "NVML call nvmlDeviceGetUUID did not answer in time"),
            unidentified(2, 7.0, "not usable: GPU_IS_LOST from nvmlDeviceGetHandleByIndex"),
        ),
    )
    builder = SeriesBuilder()
    for built in (builder.build(snapshot), builder.build(snapshot)):  # the cached series too
        views = built.devices()
        assert [(v.index, v.uuid, v.up) for v in views] == [
            (0, "GPU-a", True),
            (1, "", False),
            (2, "", False),
        ]
        assert [v.readings for v in views] == [
            (Reading("gpu_power_watts", 100.0),),
            (Reading("gpu_xid_errors_total", 1.0, (("xid", "79"),)),),
            (Reading("gpu_xid_errors_total", 7.0, (("xid", "79"),)),),
        ]
        assert views[1].down_reason.endswith("did not answer in time")
        assert views[2].down_reason.startswith("not usable: GPU_IS_LOST")
        ups = {dict(row.labels)["gpu"]: row.labels for row in built.of("gpu_up")}
        assert ups["1"] == (("gpu", "1"),)  # the empty uuid is dropped, as Prometheus reads it


def test_a_reading_seen_before_is_still_checked_for_its_value_and_labelled_as_now() -> None:
    """The builder reuses the label set a (family, labels) passed the check with last tick;
    the value is still checked each tick, and a change of pods or of labels is not missed."""
    builder = SeriesBuilder()

    def tick(value: object, pods: tuple = (), sensor: str = "gpu") -> list[Series]:
        readings = (
            Reading("gpu_power_watts", value),  # type: ignore[arg-type]
            Reading("gpu_temperature_celsius", 40.0, (("sensor", sensor),)),
        )
        device = DeviceSample(0, "GPU-a", {}, True, readings)
        labels = {"GPU-a": pods} if pods else {}
        result = builder.build(Snapshot(1.0, (device,), device_labels=labels))
        return [*result.of("gpu_power_watts"), *result.of("gpu_temperature_celsius")]

    base = (("gpu", "0"), ("uuid", "GPU-a"))
    assert tick(300.0)[0] == Series("gpu_power_watts", "gpu_power_watts", base, 300.0)
    assert tick(301)[0].value == 301.0 and type(tick(302)[0].value) is float
    assert [r.family for r in tick(True)] == ["gpu_temperature_celsius"]  # bool: refused
    assert [r.family for r in tick(None)] == ["gpu_temperature_celsius"]
    pod = (("namespace", "ml"), ("pod", "p"), ("container", "c"))
    assert tick(303.0, pods=pod)[0].labels == (*base, *pod)
    assert tick(304.0)[0].labels == base  # the pod is gone: so are its labels
    assert tick(305.0, sensor="")[1].labels == base  # an empty label value is dropped
    assert tick(306.0, sensor="memory")[1].labels == (*base, ("sensor", "memory"))
