"""Bugs the type check found in the fake NVML (each test failed before its fix)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml as N
import pytest

from gpu_exporter import sim
from gpu_exporter.sim.fake_nvml import FakeNvmlLib


@pytest.fixture
def fake() -> Iterator[FakeNvmlLib]:
    lib = sim.install({"name": "types", "devices": [{}, {}]}, clock=lambda: 0.0)
    N.nvmlInit()
    try:
        yield lib
    finally:
        sim.uninstall()


# A NULL `const char *` reaches the fake as a c_char_p whose value is None; the fake called
# .decode() on it and raised AttributeError out of a "C" call. It now reads as "", the answer
# the fake already gave a bare None: no device has that UUID; "" is no bus id.


def test_null_uuid_is_not_found(fake: FakeNvmlLib) -> None:
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetHandleByUUID(None)


def test_null_bus_id_is_invalid(fake: FakeNvmlLib) -> None:
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetHandleByPciBusId(None)


def test_null_matches_bare_none(fake: FakeNvmlLib) -> None:
    out = ctypes.c_void_p()
    for name in ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId_v2"):
        fn = getattr(fake, name)
        assert fn(ctypes.c_char_p(None), ctypes.byref(out)) == fn(None, ctypes.byref(out))


def test_null_handles_are_invalid(fake: FakeNvmlLib) -> None:
    """NULL handles (token None) find nothing, as before the lookups were typed."""
    null = ctypes.c_void_p(None)
    assert fake.nvmlEventSetFree(null) == N.NVML_ERROR_INVALID_ARGUMENT
    assert fake.nvmlGpmSampleFree(null) == N.NVML_ERROR_INVALID_ARGUMENT
    assert fake.nvmlDeviceGetIndex(null, ctypes.byref(ctypes.c_uint())) == (
        N.NVML_ERROR_INVALID_ARGUMENT
    )


def test_error_string_is_bytes(fake: FakeNvmlLib) -> None:
    assert N.nvmlErrorString(N.NVML_ERROR_NOT_FOUND) == "Not Found"
    assert fake.nvmlErrorString(N.NVML_SUCCESS) == b"Success"
