"""Parity: every promtool unit-test file gives the same verdict from promtool and from
`gpu-exporter rules test` — the shipped pack's tests, the semantic tests in tests/promql/,
and deliberately broken copies of them (which both must fail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import require_tool

ROOT = Path(__file__).resolve().parent.parent
TEST_FILES = sorted((ROOT / "rules/tests").glob("*.yaml")) + sorted(
    (ROOT / "tests/promql").glob("*.test.yaml")
)


def promtool(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ours(*files: Path, semantics: str | None = None) -> subprocess.CompletedProcess[str]:
    flags = [] if semantics is None else ["--semantics", semantics]
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "rules", "test", *flags, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


FAILING_FILES = sorted((ROOT / "tests/promql/failing").glob("*.test.yaml"))


def test_there_are_test_files() -> None:
    assert len(TEST_FILES) >= 3
    assert FAILING_FILES


@pytest.mark.parametrize("path", FAILING_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_both_fail(path: Path) -> None:
    """Files whose evaluation errors (e.g. a group limit exceeded): promtool fails them."""
    theirs, mine = promtool(path), ours(path)
    assert theirs.returncode == 1, theirs.stdout + theirs.stderr
    assert mine.returncode == 1, mine.stdout + mine.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_both_pass(path: Path) -> None:
    theirs, mine = promtool(path), ours(path)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    assert mine.returncode == 0, mine.stdout + mine.stderr


SHIPPED_TEST_FILES = sorted((ROOT / "rules/tests").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED_TEST_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_shipped_packs_tests_pass_under_prometheus3_semantics_too(path: Path) -> None:
    """`rules.semantics: prometheus3` is a supported setting: the pack's own tests hold under
    it (their inputs avoid samples on a range's left edge, where the two differ)."""
    mine = ours(path, semantics="prometheus3")
    assert mine.returncode == 0, mine.stdout + mine.stderr


# (file, text to replace, replacement): each makes an expectation wrong in a different way.
MUTATIONS = [
    ("efficiency.test.yaml", "      - eval_time: 9m\n", "      - eval_time: 10m\n"),
    ("efficiency.test.yaml", "values: '0.12x40'", "values: '0.35x40'"),
    ("health.test.yaml", "at 1970-01-01 00:04:00 +0000 UTC", "at 1970-01-01 00:05:00 +0000 UTC"),
    (
        "health.test.yaml",
        '{gpu: "2", uuid: GPU-2, category: health, severity: warning}',
        '{gpu: "2", uuid: GPU-2, state: current, category: health, severity: warning}',
    ),
    ("throttling.test.yaml", "'0+6x40'", "'0+1x40'"),
    ("throttling.test.yaml", "      - eval_time: 21m\n", "      - eval_time: 22m\n"),
]


@pytest.mark.parametrize(("name", "old", "new"), MUTATIONS)
def test_both_fail_on_a_wrong_expectation(tmp_path: Path, name: str, old: str, new: str) -> None:
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "rules/gpu-exporter.rules.yaml", tmp_path)
    text = (ROOT / "rules/tests" / name).read_text()
    assert old in text, f"mutation target {old!r} not found"
    broken = tmp_path / "tests" / name
    broken.write_text(text.replace(old, new, 1))
    theirs, mine = promtool(broken), ours(broken)
    assert theirs.returncode == 1, theirs.stdout
    assert mine.returncode == 1, mine.stdout


def test_unknown_top_level_keys_of_mixed_types_are_named_not_a_traceback(tmp_path: Path) -> None:
    from gpu_exporter.alerting.rules.unit_tests import run_test_file

    path = tmp_path / "mixed.test.yaml"
    path.write_text("rule_files: []\n1: x\nfoo: y\n")
    outcome = run_test_file(path)
    assert not outcome.passed
    assert "unknown keys [1, 'foo']" in "\n".join(outcome.errors)
