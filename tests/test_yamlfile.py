"""The one YAML loader (gpu_exporter/support/yamlfile.py): its limits, merge keys, and its readers.

The daemon-level tests run the real CLI: a rule file, a configuration and a scenario that the
old loader expanded without bound or answered with a traceback must now be refused with exit 2
(exit 1 for `rules check`, promtool's "a file failed") and a message naming file and line; a
live daemon must refuse such a rule file on SIGHUP and keep its rules, ticks and memory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpu_exporter.config.load import ConfigError, load_config
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from gpu_exporter.support import yamlfile
from gpu_exporter.support.yamlfile import (
    ALIAS_NODES_FLOOR,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    YamlFileError,
    load_yaml,
    load_yaml_file,
)
from tests.daemon import command, free_port, serve_with_live_rules
from tests.support import wait_for

REPO = Path(__file__).resolve().parent.parent

# "Billion laughs": nine levels of nine aliases each, 9**9 (387 million) strings from 300 bytes.
ALIAS_BOMB = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{b}: &{b} [{','.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
DEEP = "[" * 20_000 + "]" * 20_000


@pytest.fixture(params=["libyaml", "pure-python"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both event sources the loader may run on: libyaml's (when PyYAML has it) and PyYAML's."""
    if request.param == "libyaml":
        if not hasattr(yaml, "CSafeLoader"):
            pytest.fail("PyYAML was built without libyaml; the image ships it")
        monkeypatch.setattr(yamlfile, "_EVENT_LOADER", yaml.CSafeLoader)
    else:
        monkeypatch.setattr(yamlfile, "_EVENT_LOADER", yaml.SafeLoader)
    yield request.param


def refused(text: str) -> str:
    with pytest.raises(YamlFileError) as err:
        load_yaml(text, "f.yaml")
    return str(err.value)


def peak_bytes(function: object, *args: object) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(YamlFileError):
            function(*args)  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- aliases --------------------------------------------------------------------------------


def test_the_alias_bomb_is_refused_small_and_fast(parser: str) -> None:
    assert len(ALIAS_BOMB) < 400
    message = refused(ALIAS_BOMB)
    # 9**4 values by the aliases of line 5's first *d: the first use that overdraws the budget.
    assert message.startswith("f.yaml:5: e[0]")
    assert f"aliases expand to more than {ALIAS_NODES_FLOOR} values" in message
    assert peak_bytes(load_yaml, ALIAS_BOMB, "f.yaml") < 8 << 20


def test_shared_anchors_load_as_pyyaml_loads_them(parser: str) -> None:
    text = "common: &common {team: gpu, severity: warning}\nrules:\n" + "".join(
        f"  - {{alert: A{i}, labels: *common}}\n" for i in range(200)
    )
    assert load_yaml(text, "f.yaml").data == yaml.safe_load(text)


def test_the_alias_budget_grows_with_the_file(parser: str) -> None:
    # A file that writes n values may add n through aliases (at least ALIAS_NODES_FLOOR).
    def shared(writes: int, uses: int) -> str:
        return f"base: &b [{','.join(['x'] * writes)}]\nuses: [{','.join(['*b'] * uses)}]\n"

    floor_uses = ALIAS_NODES_FLOOR // 101  # each use of a 100-item list adds 101 values
    assert len(load_yaml(shared(100, floor_uses), "f").data["uses"]) == floor_uses
    assert "aliases expand" in refused(shared(100, floor_uses + 1))
    big = 30_000  # past the floor: the file's own values are the budget
    assert len(load_yaml(shared(big, 0), "f").data["base"]) == big
    assert len(load_yaml(shared(big, 1), "f").data["uses"]) == 1
    assert "aliases expand" in refused(shared(big, 2))


def test_an_alias_inside_its_own_anchor_or_without_one_is_refused(parser: str) -> None:
    assert refused("a: 1\nb: &x [1, *x]\n") == "f.yaml:2: alias *x is inside its own anchor"
    assert refused("a: 1\nb: *nope\n") == "f.yaml:2: alias *nope has no anchor &nope before it"


def test_aliases_cannot_nest_past_the_depth_limit(parser: str) -> None:
    # Each anchor nests 40 levels; the alias places it 40 levels deep: 80 once expanded.
    text = "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n"
    assert refused(text).startswith("f.yaml:2: b")
    assert f"nested more than {MAX_DEPTH} levels deep (aliases expanded)" in refused(text)


# -- merge keys -----------------------------------------------------------------------------


MERGES = {
    "one": "base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3\n",
    "list": "a: &a {x: 1}\nb: &b {x: 2, z: 3}\nm:\n  <<: [*a, *b]\n  w: 0\n",
    "inline": "m: {<<: {x: 1, y: 1}, y: 2}\n",
    "nested": "a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nm: {<<: *b, z: 3}\n",
}


@pytest.mark.parametrize("case", sorted(MERGES))
def test_merge_keys_load_as_pyyaml_merges_them(parser: str, case: str) -> None:
    text = MERGES[case]
    assert load_yaml(text, "f.yaml").data == yaml.safe_load(text)


def test_a_merged_key_keeps_the_line_it_is_written_on(parser: str) -> None:
    located = load_yaml("base: &b\n  x: 1\n  y: 2\nm:\n  <<: *b\n  y: 3\n", "f.yaml")
    assert located.lines[("m", "x")] == 2  # written in the anchor
    assert located.lines[("m", "y")] == 6  # written here, overriding


def test_a_bad_merge_is_refused_with_its_line(parser: str) -> None:
    assert refused("m:\n  a: 1\n  <<: 5\n") == (
        "f.yaml:3: m: `<<` merges a mapping or a list of mappings"
    )
    assert refused("m:\n  <<: {a: 1}\n  <<: {b: 1}\n") == (
        "f.yaml:3: m: a second `<<` (first at line 2)"
    )


# -- keys, tags, scalars, documents ---------------------------------------------------------


def test_a_list_or_mapping_as_a_key_is_refused_with_its_line(parser: str) -> None:
    assert refused("a: 1\n? [1, 2]\n: 3\n") == (
        "f.yaml:2: (top level): a list as a mapping key (a key is a single value)"
    )
    assert refused("a:\n  {b: 1}: 2\n").startswith("f.yaml:2: a: a mapping as a mapping key")
    assert refused("x: &k [1]\ny: {*k : 1}\n").startswith("f.yaml:2: y: a list as a mapping key")


def test_a_duplicate_key_names_both_lines(parser: str) -> None:
    assert refused("a: 1\nb:\n  c: 1\n  c: 2\n") == "f.yaml:4: b.c: duplicate key (first at line 3)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: !foo 1\n", "f.yaml:1: unsupported tag !foo"),
        ("a: !!python/object:os.system x\n", "f.yaml:1: unsupported tag"),
        ("a: !!set {x, y}\n", "f.yaml:1: unsupported tag tag:yaml.org,2002:set"),
        ("a: 2001-13-45\n", "f.yaml:1: a: invalid timestamp '2001-13-45': month must be"),
        ("a: !!bool maybe\n", "f.yaml:1: a: invalid bool 'maybe'"),
        ("a: !!int x\n", "f.yaml:1: a: invalid int 'x'"),
        ("a: " + "1" * 5000 + "\n", "f.yaml:1: a: a number longer than 4300 characters"),
        ("a: 1" + ":30" * 3000 + "\n", "f.yaml:1: a: a number longer than 4300 characters"),
        ("a: 1\n---\nb: 2\n", "f.yaml:2: a second document (`---`); this file holds one"),
        ("a: [1\n", "f.yaml:2: invalid YAML:"),
        ("a: \x00\n", "f.yaml:1: invalid YAML: character U+0000 is not allowed"),
        ("a: \ud800\n", "f.yaml:1: not UTF-8 text"),
    ],
    ids=lambda value: value[:20] if isinstance(value, str) else value,
)
def test_bad_documents_name_file_and_line(parser: str, text: str, expected: str) -> None:
    assert refused(text).startswith(expected)


def test_plain_merge_and_value_indicators_as_values_are_text(parser: str) -> None:
    assert load_yaml("a: =\nb: <<\n", "f").data == {"a": "=", "b": "<<"}


# -- limits ---------------------------------------------------------------------------------


def test_20000_levels_of_nesting_are_refused_before_anything_recurses(parser: str) -> None:
    assert refused(DEEP) == f"f.yaml:1: nested more than {MAX_DEPTH} levels deep"
    block = "".join("  " * i + "-\n" for i in range(200))
    assert refused(block).endswith(f"nested more than {MAX_DEPTH} levels deep")


def test_nesting_up_to_the_limit_loads(parser: str) -> None:
    text = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    data = load_yaml(text, "f").data
    for _ in range(MAX_DEPTH - 1):
        data = data[0]
    assert data == []
    assert "nested more than" in refused("[" + text + "]")


def test_more_values_than_the_cap_are_refused_within_bounded_memory(parser: str) -> None:
    text = "[" + "0," * MAX_NODES + "0]"
    assert refused(text).startswith(f"f.yaml:1: more than {MAX_NODES} values in one file")
    assert peak_bytes(load_yaml, text, "f") < 48 << 20


def test_a_file_over_the_size_cap_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as file:
        file.truncate(8 << 30)  # sparse: 8 GiB of nothing
    with pytest.raises(YamlFileError, match=r"big\.yaml: larger than 1 MiB"):
        load_yaml_file(path)
    at_cap = tmp_path / "cap.yaml"
    at_cap.write_bytes(b"#" * (MAX_FILE_BYTES - 3) + b"\na:")
    assert load_yaml_file(at_cap).data == {"a": None}
    at_cap.write_bytes(b"#" * MAX_FILE_BYTES + b"\n")
    with pytest.raises(YamlFileError, match="larger than 1 MiB"):
        load_yaml_file(at_cap)


def test_devices_fifos_and_directories_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: opening it for reading would block forever
    for path, kind in [
        (Path("/dev/zero"), "a character device"),
        (fifo, "a FIFO"),
        (tmp_path, "a directory"),
    ]:
        with pytest.raises(YamlFileError) as err:
            load_yaml_file(path)
        assert str(err.value) == f"{path}: cannot read: {kind}, not a regular file"
    with pytest.raises(YamlFileError, match="cannot read: No such file"):
        load_yaml_file(tmp_path / "absent.yaml")


def test_bytes_that_are_not_utf8_are_named_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(YamlFileError, match=r"latin1\.yaml:2: not UTF-8 text \(byte 11\)"):
        load_yaml_file(path)


def test_every_shipped_yaml_loads_as_pyyaml_loads_it(parser: str) -> None:
    paths = [
        *REPO.glob("gpu_exporter/**/*.yaml"),
        *REPO.glob("rules/**/*.yaml"),
        *REPO.glob("helm/gpu-exporter/*.yaml"),
        *REPO.glob("helm/gpu-exporter/ci/*.yaml"),
    ]
    assert len(paths) > 10
    for path in paths:
        assert load_yaml_file(path).data == yaml.safe_load(path.read_text()), path


# -- every reader goes through the loader ---------------------------------------------------


def test_config_and_scenario_files_get_the_loaders_errors(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(ConfigError, match=r"bomb\.yaml:5: .*aliases expand"):
        load_config(path, environ={})
    with pytest.raises(ScenarioError, match=r"bomb\.yaml:5: .*aliases expand"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="/dev/zero: cannot read: a character device"):
        load_scenario("/dev/zero")


def test_a_config_may_use_anchors_and_merge_keys(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "alerting:\n"
        "  external_labels: &labels {cluster: prod, region: eu}\n"
        "  alertmanagers:\n"
        "    - url: http://am-a:9093\n"
        "      tls: &tls {insecure_skip_verify: true}\n"
        "    - {url: 'http://am-b:9093', tls: {<<: *tls}}\n"
    )
    config = load_config(path, environ={})
    assert config.alerting.external_labels == {"cluster": "prod", "region": "eu"}
    assert [am.tls.insecure_skip_verify for am in config.alerting.alertmanagers] == [True, True]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args), capture_output=True, text=True, timeout=timeout, check=False
    )


BAD_YAML = {
    "alias bomb": (ALIAS_BOMB, 5, "aliases expand to more than"),
    "deep nesting": ("a: 1\nb: " + DEEP + "\n", 2, "nested more than 64 levels deep"),
    "list as key": ("a: 1\n? [x, y]\n: 2\n", 2, "a list as a mapping key"),
    "bad merge": ("a: 1\nb:\n  <<: [1, 2]\n", 3, "`<<` merges a mapping or a list of mappings"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_rules_check_refuses_a_bad_rule_file_naming_file_and_line(
    tmp_path: Path, case: str
) -> None:
    text, line, expected = BAD_YAML[case]
    path = tmp_path / "bad.rules.yaml"
    path.write_text(text)
    result = run_cli("rules", "check", str(path))
    assert result.returncode == 1, result.stdout + result.stderr  # promtool's "a file failed"
    assert "Traceback" not in result.stderr
    assert f"FAILED:\n    {path}:{line}: " in result.stdout and expected in result.stdout


@pytest.mark.parametrize("case", sorted(BAD_YAML))
@pytest.mark.parametrize("where", ["config", "rules", "scenario"])
def test_serve_exits_2_naming_file_and_line(tmp_path: Path, case: str, where: str) -> None:
    text, line, expected = BAD_YAML[case]
    path = tmp_path / f"bad.{where}.yaml"
    path.write_text(text)
    option = {"config": "--config", "rules": "--rules", "scenario": "--simulate"}[where]
    simulate = [] if where == "scenario" else ["--simulate", "mixed"]
    listen = f"127.0.0.1:{free_port()}"
    result = run_cli("serve", "--listen-address", listen, *simulate, option, str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"{path}:{line}: " in result.stderr and expected in result.stderr


def test_serve_with_dev_zero_as_config_exits_2_at_once() -> None:
    start = time.monotonic()
    result = run_cli("serve", "--config", "/dev/zero", timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "config error: /dev/zero: cannot read: a character device, not a regular file"
    )
    assert time.monotonic() - start < 20  # generous: a Python start; it used to read forever


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def test_sighup_with_an_alias_bomb_keeps_rules_ticks_and_memory(tmp_path: Path) -> None:
    kept = "groups:\n- name: live\n  rules:\n  - alert: Kept\n    expr: gpu_up == 1\n"
    with serve_with_live_rules(tmp_path, kept) as (daemon, rules):
        assert daemon.rule_names() == ["Kept"]
        wait_for(lambda: daemon.sample("gpu_exporter_ticks_total") >= 3, 15)
        steady = _rss_kib(daemon.process.pid)
        rules.write_text(ALIAS_BOMB)
        daemon.reload_rules()
        wait_for(
            lambda: "gpu_exporter_rule_reload_success 0.0" in daemon.metrics_text(),
            15,
            "the refused reload to be reported",
        )
        assert daemon.sample("gpu_exporter_rule_reload_failures_total") == 1
        assert "aliases expand to more than" in daemon.output()
        assert daemon.rule_names() == ["Kept"]
        ticks = daemon.sample("gpu_exporter_ticks_total")
        wait_for(
            lambda: daemon.sample("gpu_exporter_ticks_total") >= ticks + 2,
            15,
            "ticks after the refused reload",
        )
        assert _rss_kib(daemon.process.pid) < 2 * steady
        assert daemon.process.poll() is None
