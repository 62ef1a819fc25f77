"""Regexes that make a backtracking engine run for minutes finish at once, in-process and live.

Python's `re` needs ~0.7 s for `([a-z0-9]+-?)+-worker-[0-9]+` against 24 `a`s and four times
more per extra two; against 40 it would hold the GIL for hours. The rule engine runs every
regex on RE2, whose time is linear in the input.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import httpx

from gpu_exporter.alerting.rules.unit_tests import run_test_files
from tests.daemon import serve_with_live_rules
from tests.support import promtool, wait_for

UUID_BOMB = "GPU-([0-9a-f]+-?)*Z"  # promtool and `rules check` accept it
POD_BOMB = "([a-z0-9]+-?)+-worker-[0-9]+"
LONG_POD = "a" * 40
UUIDS = ["GPU-3c1e2b5a-9f0d-4e7c-8b6a-5d4c3b2a1f0e", "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"]

RULES = {
    "groups": [
        {
            "name": "bombs",
            "rules": [
                {"alert": "UuidEndsInZ", "expr": f'gpu_up{{uuid=~"{UUID_BOMB}"}}'},
                {"alert": "NoUuidEndsInZ", "expr": f'absent(gpu_up{{uuid=~"{UUID_BOMB}"}})'},
                {"alert": "Worker", "expr": f'gpu_pod_up{{pod=~"{POD_BOMB}"}}'},
                {
                    "alert": "Templated",
                    "expr": "gpu_pod_up",
                    "annotations": {
                        "worker": f'{{{{ if match "^(?:{POD_BOMB})$" $labels.pod }}}}yes'
                        "{{ else }}no{{ end }}",
                        "uuid": f'{{{{ reReplaceAll "{UUID_BOMB}" "z" $labels.uuid }}}}',
                    },
                },
            ],
        }
    ]
}


def _unit_test() -> dict[str, object]:
    pods = [LONG_POD, "train-a-worker-3"]
    series = [{"series": f'gpu_up{{uuid="{u}"}}', "values": "1x2"} for u in UUIDS]
    series += [
        {"series": f'gpu_pod_up{{pod="{p}",uuid="{u}"}}', "values": "1x2"}
        for p, u in zip(pods, UUIDS, strict=True)
    ]

    def templated(pod: str, uuid: str, worker: str) -> dict[str, object]:
        return {
            "exp_labels": {"pod": pod, "uuid": uuid},
            "exp_annotations": {"worker": worker, "uuid": uuid},
        }

    return {
        "rule_files": ["bombs.rules.json"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": "UuidEndsInZ", "exp_alerts": []},
                    {"eval_time": "1m", "alertname": "NoUuidEndsInZ", "exp_alerts": [{}]},
                    {
                        "eval_time": "1m",
                        "alertname": "Worker",
                        "exp_alerts": [{"exp_labels": {"pod": pods[1], "uuid": UUIDS[1]}}],
                    },
                    {
                        "eval_time": "1m",
                        "alertname": "Templated",
                        "exp_alerts": [
                            templated(pods[0], UUIDS[0], "no"),
                            templated(pods[1], UUIDS[1], "yes"),
                        ],
                    },
                ],
            }
        ],
    }


def test_catastrophic_regexes_evaluate_in_process_at_once(tmp_path: Path) -> None:
    (tmp_path / "bombs.rules.json").write_text(json.dumps(RULES))
    test_file = tmp_path / "bombs.test.json"
    test_file.write_text(json.dumps(_unit_test()))
    # promtool (Go's RE2-style regexp) says what the results are...
    proc = promtool("test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ...and our engine, which would spin for hours on `re`, agrees at once.
    out = StringIO()
    start = time.monotonic()
    passed = run_test_files([test_file], out)
    elapsed = time.monotonic() - start
    assert passed, out.getvalue()
    assert elapsed < 1.0, f"{elapsed:.2f}s"


LIVE_RULES = """\
groups:
- name: live
  rules:
  - alert: NoUuidEndsInZ
    expr: absent(gpu_up{uuid=~"GPU-([0-9a-f]+-?)*Z"})
  - alert: GpuUp
    expr: gpu_up{uuid=~"GPU-([0-9a-f]+-?)*"} == 1
    annotations:
      worker: '{{ if match "^(?:([a-z0-9]+-?)+-worker-[0-9]+)$" "%s" }}yes{{ else }}no{{ end }}'
      uuid: '{{ reReplaceAll "GPU-([0-9a-f]+-?)*Z" "z" $labels.uuid }}'
""" % ("a" * 40)


def test_a_daemon_reloading_catastrophic_regexes_stays_live_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    first = "groups:\n- name: live\n  rules:\n  - alert: First\n    expr: gpu_up == 1\n"
    with serve_with_live_rules(tmp_path, first) as (daemon, rules):

        def alerts() -> list[dict[str, object]]:
            return daemon.get("/api/v1/alerts").json()["data"]["alerts"]

        rules.write_text(LIVE_RULES)
        daemon.reload_rules()
        firing = wait_for(
            lambda: [a for a in alerts() if a["labels"]["alertname"] == "GpuUp"],  # type: ignore[index]
            15,
            "the reloaded rules to evaluate",
        )
        assert {a["annotations"]["worker"] for a in firing} == {"no"}  # type: ignore[index]
        assert all(a["annotations"]["uuid"] == a["labels"]["uuid"] for a in firing)  # type: ignore[index]
        assert any(a["labels"]["alertname"] == "NoUuidEndsInZ" for a in alerts())  # type: ignore[index]
        ticks = daemon.sample("gpu_exporter_ticks_total")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # a few evaluation intervals under the new rules
            start = time.monotonic()
            response = httpx.get(f"{daemon.url}/healthz", timeout=1.0)
            assert response.status_code == 200 and time.monotonic() - start < 1.0
            time.sleep(0.2)
        assert daemon.sample("gpu_exporter_ticks_total") > ticks, "ticking stopped"
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(timeout=10) == 0, daemon.output()[-2000:]


def test_rules_check_refuses_what_re2_refuses_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.rules.yaml"
    path.write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - alert: Lookahead\n    expr: gpu_up == 1\n    annotations:\n"
        "      summary: '{{ if match \"(?=x)\" $labels.uuid }}x{{ end }}'\n"  # line 7
        "  - alert: Backreference\n    expr: gpu_up == 1\n    labels:\n"
        '      team: \'{{ reReplaceAll "(a)\\\\1" "" $labels.uuid }}\'\n'  # line 11
        '  - alert: Wide\n    expr: gpu_up{uuid=~"a{1001}"}\n'  # line 13
        "  - alert: Fine\n    expr: gpu_up == 0\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "rules", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        f"{path}:7: groups[0].rules[0].annotations.summary: alert Lookahead: template: "
        "line 1, column 7: match: error parsing regexp: invalid or unsupported Perl syntax: `(?=`"
    ) in proc.stdout
    assert (
        f"{path}:11: groups[0].rules[1].labels.team: alert Backreference: template: "
        "line 1, column 4: reReplaceAll: error parsing regexp: invalid escape sequence: `\\1`"
    ) in proc.stdout
    assert f"{path}:13: groups[0].rules[2].expr: alert Wide:" in proc.stdout
    assert "invalid repeat count: `{1001}`" in proc.stdout
