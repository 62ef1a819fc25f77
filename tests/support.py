"""Helpers shared by tests: tool lookup, promtool and gRPC channels to the fakes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout: float, what: str = "a condition", interval: float = 0.2
) -> T:
    """Poll until `predicate()` is truthy and return it; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    value = predicate()
    if value:
        return value
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def unix_channel(socket_path: str) -> grpc.Channel:
    """A gRPC channel to a fake's unix socket that shares no connection state with others.

    gRPC shares subchannels between channels to one address by default, backoff included: a
    test that saw the socket refuse a connection and then restarted the server would have its
    next channel fail at once with the old "Connection refused" until that backoff ends."""
    return grpc.insecure_channel(
        "unix://" + socket_path, options=[("grpc.use_local_subchannel_pool", 1)]
    )


def require_tool(name: str) -> str:
    """Path of a tool the suite depends on; scripts/test.sh installs them, so absence fails."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run scripts/test.sh, which installs it")
    return path


def promtool(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """promtool with these arguments; its exit status and output, text."""
    return subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def gpu_exporter(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI (`python -m gpu_exporter ARGS`) in a fresh interpreter; exit status and text."""
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def promtool_check_metrics(text: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        timeout=30,
        check=False,
    )
