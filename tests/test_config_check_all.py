"""`gpu-exporter config check` reports every problem of a configuration in one run, each with
`file:line`: wrong settings do not hide the problems of the files the others name (its
scenario, web-config and rule files), a rule pattern that matches nothing does not hide the
problems of the files the others match, and a named file with no line of its own (missing,
matching nothing) is placed at the line of the setting that names it."""

from __future__ import annotations

from pathlib import Path

from tests.test_config_check import BAD_RULES, assert_refused, config_check, write


def test_settings_errors_do_not_hide_the_named_files_problems(tmp_path: Path) -> None:
    write(tmp_path / "bad.rules.yaml", BAD_RULES)
    write(tmp_path / "web.yml", "basic_auth_users:\n  alice: plain\n")
    write(tmp_path / "scenario.yaml", "name: x\ndevices:\n  - model: H100\n    colour: blue\n")
    config = write(
        tmp_path / "config.yaml",
        "interval_seconds: 0.1\n"
        "nvml:\n  gmp: false\n"
        "simulate: scenario.yaml\n"
        "web_config_file: web.yml\n"
        "rules:\n  files: [bad.rules.yaml]\n",
    )
    result = config_check(config, cwd=tmp_path)
    assert_refused(
        result,
        f"{config}:1: interval_seconds: Input should be greater than or equal to 0.2",
        f"{config}:3: nvml.gmp: unknown setting",
        "scenario.yaml:4: devices[0].colour",
        "web.yml:2: basic_auth_users.alice",
        "bad.rules.yaml:7: groups[0].rules[1].expr: alert Broken: invalid PromQL",
    )


def test_the_files_a_wrong_setting_names_are_not_read(tmp_path: Path) -> None:
    """A setting that is itself wrong (a number for a file name) is reported once, as a
    setting; the rest is checked with it left at its default."""
    write(tmp_path / "bad.rules.yaml", BAD_RULES)
    config = write(
        tmp_path / "config.yaml", "web_config_file: [1]\nrules:\n  files: [bad.rules.yaml]\n"
    )
    result = config_check(config, cwd=tmp_path)
    assert_refused(result, f"{config}:1: web_config_file: ", "bad.rules.yaml:7: ")
    assert result.stderr.count("web_config_file") == 1, result.stderr


def test_every_rule_file_is_checked_and_files_without_lines_point_at_the_setting(
    tmp_path: Path,
) -> None:
    write(tmp_path / "bad.rules.yaml", BAD_RULES)
    config = write(
        tmp_path / "config.yaml",
        "simulate: no-such-scenario\n"
        "web_config_file: missing-web.yml\n"
        "rules:\n"
        "  files:\n"
        "    - missing/*.yaml\n"
        "    - bad.rules.yaml\n",
    )
    result = config_check(config, cwd=tmp_path)
    assert_refused(
        result,
        f"{config}:1: simulate: no-such-scenario: no such scenario file or built-in",
        f"{config}:2: web_config_file: missing-web.yml: cannot read",
        f"{config}:5: rules.files[0]: missing/*.yaml: no rule file matches",
        "bad.rules.yaml:7: groups[0].rules[1].expr: alert Broken: invalid PromQL",
    )
