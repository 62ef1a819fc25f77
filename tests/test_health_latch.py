"""The health verdict is latched until the evidence that the GPU was fixed
(gpu_exporter/collect/health_latch.py): manual sequences of ticks, one minute apart, with the
readings the collectors would give."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from gpu_exporter.collect.health_latch import FORGET_AFTER_SECONDS, HealthLatch
from gpu_exporter.model.health_verdict import EVENT_HOLD_SECONDS
from gpu_exporter.model.snapshot import DeviceSample, DownCause, Reading
from tests.test_health_verdict import outputs, recovery

MINUTE = 60.0
HEALTHY = ("pass", "none", "healthy")
LOST = ("critical", "reset_gpu", "gpu_lost")


def ecc(uncorrected: float, corrected: float = 0.0) -> tuple[Reading, ...]:
    """The volatile counts (reset to 0 by a GPU reset or driver reload)."""
    return (
        Reading("gpu_ecc_errors_total", corrected, (("error", "corrected"),)),
        Reading("gpu_ecc_errors_total", uncorrected, (("error", "uncorrected"),)),
    )


def xids(**counts: float) -> tuple[Reading, ...]:
    """gpu_xid_errors_total as the xid collector reports it: xids(x79=1)."""
    return tuple(
        Reading("gpu_xid_errors_total", count, (("xid", name.removeprefix("x")),))
        for name, count in counts.items()
    )


def flags(**values: float) -> tuple[Reading, ...]:
    return tuple(Reading(f"gpu_{name}", value) for name, value in values.items())


class Ticks:
    """One GPU (or several) ticked through a latch, a minute apart."""

    def __init__(self, latch: HealthLatch | None = None, start: float = 1_000.0) -> None:
        self.latch = latch or HealthLatch()
        self.now = start

    def tick(
        self,
        readings: Iterable[Reading] = (),
        up: bool = True,
        uuid: str = "GPU-a",
        cause: DownCause = DownCause.FAILED,
    ) -> tuple[str, str, str]:
        sample = DeviceSample(0, uuid, {}, up, tuple(readings), down_cause=cause)
        (device,) = self.latch.process([sample], self.now)
        self.now += MINUTE
        return outputs(device)

    def wait(self, seconds: float) -> None:
        self.now += seconds


def test_a_critical_xid_stays_critical_until_a_gpu_reset_is_seen() -> None:
    gpu = Ticks()
    assert gpu.tick((*ecc(0, 4), *xids(x79=0))) == HEALTHY
    assert gpu.tick((*ecc(0, 4), *xids(x79=1))) == ("critical", "reboot_node", "xid_79")
    for _ in range(30):  # 30 minutes on, nothing was reset
        assert gpu.tick((*ecc(0, 4), *xids(x79=1))) == ("critical", "reboot_node", "xid_79")
    # The reset zeroes the volatile counters: that is the evidence.
    assert gpu.tick((*ecc(0, 0), *xids(x79=1))) == HEALTHY
    assert gpu.tick((*ecc(0, 0), *xids(x79=1))) == HEALTHY  # the old count is no new event


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(ecc(2, 7), ecc(0, 0), id="volatile ECC counters zeroed"),
        pytest.param(ecc(0, 7), ecc(0, 1), id="corrected count went down (reset, then 1 more)"),
        pytest.param(flags(row_remap_pending=1), flags(row_remap_pending=0), id="remap applied"),
        pytest.param(
            flags(retired_pages_pending=1),
            flags(retired_pages_pending=0),
            id="pages retired",
        ),
        pytest.param(recovery("gpu_reset"), recovery("none"), id="recovery action back to none"),
    ],
)
def test_each_kind_of_reset_evidence_clears_an_xid(
    before: tuple[Reading, ...], after: tuple[Reading, ...]
) -> None:
    gpu = Ticks()
    gpu.tick(before)
    assert gpu.tick((*before, *xids(x95=1)))[0] == "critical"
    assert gpu.tick((*before, *xids(x95=1)))[0] == "critical"
    assert gpu.tick((*after, *xids(x95=1))) == HEALTHY


def test_what_is_not_reset_evidence_clears_nothing() -> None:
    gpu = Ticks()
    critical = ("critical", "reset_gpu", "xid_62")
    gpu.tick(ecc(0, 3))
    assert gpu.tick((*ecc(0, 3), *xids(x62=1))) == critical
    assert gpu.tick(()) == critical  # every reading absent (a failed read): no evidence
    assert gpu.tick(xids(x62=1), up=False)[0] == "critical"  # down: no ECC read, nothing seen
    assert gpu.tick((*ecc(0, 3), *xids(x62=1))) == critical  # back, same counts: not reset
    assert gpu.tick((*ecc(0, 5), *recovery("none"), *xids(x62=1))) == critical  # none all along
    gpu.wait(7 * 24 * 3600)  # a week
    assert gpu.tick((*ecc(0, 5), *xids(x62=1))) == critical


def test_a_new_xid_after_the_reset_in_the_same_tick_holds() -> None:
    gpu = Ticks()
    gpu.tick((*ecc(0, 9), *xids(x79=1)))
    assert gpu.tick((*ecc(0, 0), *xids(x79=1, x119=1))) == ("critical", "reset_gpu", "xid_119")


def test_a_lost_gpu_is_critical_until_it_answers_under_its_uuid() -> None:
    gpu = Ticks()
    assert gpu.tick(ecc(0)) == HEALTHY
    for _ in range(5):
        assert gpu.tick((), up=False) == ("critical", "reset_gpu", "gpu_lost")
    # Another GPU answering in its place (another UUID) is not this one back.
    assert gpu.tick(ecc(0), uuid="GPU-other") == HEALTHY
    assert gpu.tick((), up=False) == ("critical", "reset_gpu", "gpu_lost")
    assert gpu.tick(ecc(0)) == HEALTHY


def test_a_late_read_is_a_hang_only_when_the_next_is_late_too() -> None:
    gpu = Ticks()
    assert gpu.tick(ecc(0)) == HEALTHY
    # One read past the deadline, as a healthy GPU's can be on a node whose CPUs are busy.
    assert gpu.tick((), up=False, cause=DownCause.LATE) == HEALTHY
    assert gpu.tick(ecc(0)) == HEALTHY
    assert gpu.tick((), up=False, cause=DownCause.LATE) == HEALTHY
    assert gpu.tick((), up=False, cause=DownCause.LATE) == LOST  # late twice running: hung
    assert gpu.tick((), up=False, cause=DownCause.UNREAD) == LOST  # held while not answering
    assert gpu.tick(ecc(0)) == HEALTHY
    assert gpu.tick((), up=False, cause=DownCause.LATE) == HEALTHY  # the count starts over


def test_a_tick_the_gpu_was_not_read_in_is_no_evidence_either_way() -> None:
    gpu = Ticks()
    for _ in range(3):  # every reader busy, NVML being re-initialised, the source failing
        assert gpu.tick((), up=False, cause=DownCause.UNREAD) == HEALTHY
    assert gpu.tick((), up=False, cause=DownCause.LATE) == HEALTHY
    assert gpu.tick((), up=False, cause=DownCause.UNREAD) == HEALTHY
    assert gpu.tick((), up=False, cause=DownCause.LATE) == LOST  # the second late read running
    assert gpu.tick((), up=False, cause=DownCause.UNREAD) == LOST


def test_a_gpu_back_after_xid_79_stays_critical_for_the_xid() -> None:
    """The faults scenario's GPU 1: XID 79, lost, back after a re-init: nothing reset it."""
    gpu = Ticks()
    gpu.tick((*ecc(0), *xids(x79=0)))
    assert gpu.tick((*ecc(0), *xids(x79=1))) == ("critical", "reboot_node", "xid_79")
    assert gpu.tick(xids(x79=1), up=False) == ("critical", "reboot_node", "xid_79")
    assert gpu.tick((*ecc(0), *xids(x79=1))) == ("critical", "reboot_node", "xid_79")


def test_a_recovery_action_holds_until_it_is_none() -> None:
    gpu = Ticks()
    assert gpu.tick(recovery("none")) == HEALTHY
    asked = ("critical", "drain_and_reset", "recovery_action_drain_and_reset")
    assert gpu.tick(recovery("drain_and_reset")) == asked
    assert gpu.tick(()) == asked  # the field not read this tick
    assert gpu.tick(recovery("drain_p2p")) == (
        "critical",
        "drain_p2p",
        "recovery_action_drain_p2p",
    )  # the driver moved on: its current action, not both
    assert gpu.tick(recovery("none")) == HEALTHY


def test_a_driver_without_the_recovery_action_field_changes_nothing() -> None:
    gpu = Ticks()
    assert gpu.tick(flags(row_remap_pending=1)) == ("warning", "reset_gpu", "row_remap_pending")
    assert gpu.tick(flags(row_remap_pending=1)) == ("warning", "reset_gpu", "row_remap_pending")
    assert gpu.tick(flags(row_remap_pending=0)) == HEALTHY


def test_a_restart_re_derives_only_what_the_driver_still_shows() -> None:
    before = Ticks()
    before.tick((*ecc(2), *xids(x48=0), *flags(row_remap_pending=1)))
    assert before.tick((*ecc(2), *xids(x48=1), *flags(row_remap_pending=1)))[2] == "xid_48"
    # The exporter restarts: a new latch, NVML's XID counts start again from nothing.
    after = Ticks(HealthLatch(), start=before.now)
    still = (*ecc(2), *xids(x48=0), *flags(row_remap_pending=1))
    assert after.tick(still) == ("critical", "drain_and_reset", "uncorrected_ecc")
    # The GPU's driver shows only a pending remap: a warning, the XID is gone with the process.
    restarted = Ticks(HealthLatch(), start=before.now)
    assert restarted.tick((*ecc(0), *xids(x48=0), *flags(row_remap_pending=1))) == (
        "warning",
        "reset_gpu",
        "row_remap_pending",
    )
    # A recovery action the driver still asks for is re-read as well.
    assert Ticks(HealthLatch()).tick(recovery("node_reboot"))[0] == "critical"
    assert Ticks(HealthLatch()).tick(xids(x79=0)) == HEALTHY


def test_an_xid_counted_before_the_first_tick_is_an_event() -> None:
    """NVML reports only XIDs after the exporter registered: any count is news to the latch."""
    assert Ticks().tick(xids(x74=2)) == ("critical", "reset_gpu", "xid_74")


def test_application_xids_hold_for_ten_minutes_after_the_last() -> None:
    gpu = Ticks()
    assert gpu.tick(xids(x94=1)) == ("warning", "restart_app", "xid_94")
    gpu.wait(EVENT_HOLD_SECONDS - 2 * MINUTE)
    assert gpu.tick(xids(x94=2)) == ("warning", "restart_app", "xid_94")  # again: held anew
    gpu.wait(EVENT_HOLD_SECONDS - 2 * MINUTE)
    assert gpu.tick(xids(x94=2))[0] == "warning"
    gpu.wait(2 * MINUTE)
    assert gpu.tick(xids(x94=2)) == HEALTHY
    assert gpu.tick(xids(x13=1)) == ("info", "restart_app", "xid_13")


def test_xid_48_with_63_since_the_last_reset_asks_for_a_drain() -> None:
    gpu = Ticks()
    gpu.tick((*ecc(0, 5), *xids(x48=0, x63=0)))
    assert gpu.tick((*ecc(0, 5), *xids(x48=1, x63=0))) == ("critical", "reset_gpu", "xid_48")
    assert gpu.tick((*ecc(0, 5), *xids(x48=1, x63=1))) == (
        "critical",
        "drain_and_reset",
        "xid_48",
    )
    # The reset clears 48; 63, informational, shows for its ten minutes.
    assert gpu.tick((*ecc(0, 0), *xids(x48=1, x63=1))) == ("info", "none", "xid_63")
    # After the reset, a new XID 48 is solo again: the 63 belonged to the fault before.
    assert gpu.tick((*ecc(0, 0), *xids(x48=2, x63=1))) == ("critical", "reset_gpu", "xid_48")


def test_the_reason_shown_stays_while_it_holds() -> None:
    gpu = Ticks()
    assert gpu.tick(xids(x64=1)) == ("critical", "reset_gpu", "xid_64")
    assert gpu.tick(xids(x64=1, x46=1)) == ("critical", "reset_gpu", "xid_64")
    # A worse step from another XID: shown as the action, the reason stays.
    assert gpu.tick(xids(x64=1, x46=1, x79=1)) == ("critical", "reboot_node", "xid_64")
    assert gpu.tick(xids(x64=1, x46=1, x79=1), up=False) == ("critical", "reboot_node", "xid_64")


def test_a_worse_verdict_takes_the_reason() -> None:
    gpu = Ticks()
    assert gpu.tick(xids(x94=1)) == ("warning", "restart_app", "xid_94")
    assert gpu.tick(xids(x94=1, x95=1)) == ("critical", "reset_gpu", "xid_95")


def test_gpus_are_judged_apart_and_forgotten_when_gone_for_long() -> None:
    latch = HealthLatch()
    a = DeviceSample(0, "GPU-a", {}, True, xids(x79=1))
    b = DeviceSample(1, "GPU-b", {}, True, ())
    out = latch.process([a, b], 0.0)
    assert [outputs(d)[0] for d in out] == ["critical", "pass"]
    latch.process([b], FORGET_AFTER_SECONDS)
    assert latch.verdict("GPU-a") is not None  # gone, not yet for long
    latch.process([b], FORGET_AFTER_SECONDS + 1.0)
    assert latch.verdict("GPU-a") is None
    assert latch.verdict("GPU-b") is not None


def test_bad_readings_are_no_evidence_and_never_raise() -> None:
    gpu = Ticks()
    nan = float("nan")
    odd = (
        Reading("gpu_xid_errors_total", 1.0, (("xid", "not-a-number"),)),
        Reading("gpu_xid_errors_total", 1.0),  # no xid label
        Reading("gpu_xid_errors_total", 1.0, (("xid", "999"),)),  # not in the table
        Reading("gpu_ecc_errors_total", nan, (("error", "uncorrected"),)),
        Reading("gpu_ecc_errors_total", 1.0),  # no error label
        Reading("gpu_recovery_action", 1.0),  # no action label
        Reading("gpu_fabric_health_summary", 1.0, (("summary", "brand_new"),)),
    )
    assert gpu.tick(odd) == HEALTHY
    assert gpu.tick(flags(row_remap_failure=1)) == ("critical", "service", "row_remap_failure")
    assert gpu.tick((*odd, Reading("gpu_row_remap_failure", nan))) == (
        "critical",
        "service",
        "row_remap_failure",
    )
    unidentified = DeviceSample(3, "", {}, True, xids(x79=1))
    (device,) = HealthLatch().process([unidentified], 0.0)
    assert outputs(device)[0] == "critical"
