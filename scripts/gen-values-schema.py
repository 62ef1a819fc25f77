#!/usr/bin/env python3
"""Write the parts of helm/gpu-exporter/values.schema.json that describe the daemon's settings,
generated from its configuration model (gpu_exporter/config/load.py), so that the chart refuses what
the daemon would refuse (an unknown setting, a wrong type, a value out of range) at `helm
template` / `helm install` time instead of every pod exiting 2. The rest of the schema is
written by hand and left as it is.

Generated: `config.extra` (the whole configuration), `config.nvml`, `config.metrics`, and the
chart values that become one daemon setting each (`GENERATED_LEAVES`; those in
`EMPTY_MEANS_DEFAULT` also accept "", which the chart writes as no setting at all). Every
subschema is inlined (no `$ref`), which every JSON-schema validator Helm has used reads. Numbers
also accept numeric strings: `helm --set` makes `0.5` a string (only integers, true/false and
null get a type), and `--set-string` makes every value one; the daemon reads numeric strings as
numbers, and the chart's template converts its own values with float64/int. A numeric string's
range is checked by the daemon (and `gpu-exporter config check`), not by the schema, which
cannot compare strings as numbers. What the model checks in code (listen addresses, label names,
settings that must agree with each other) is left to the daemon too.

    scripts/gen-values-schema.py           # rewrite the generated parts
    scripts/gen-values-schema.py --check   # exit 1 when the file is not what it would write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_exporter.collect.settings import NvmlConfig  # noqa: E402
from gpu_exporter.config.load import Config  # noqa: E402
from gpu_exporter.web.settings import MetricsConfig  # noqa: E402

SCHEMA_FILE = ROOT / "helm" / "gpu-exporter" / "values.schema.json"
COMMENT = (
    "Generated from gpu_exporter/config/load.py by scripts/gen-values-schema.py; edit the model."
)

# Strings helm's template functions turn into the same number the daemon reads: float64 uses
# Go's strconv.ParseFloat; int parses base 0, where a leading 0 would mean octal.
NUMBER_STRING = r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
INTEGER_STRING = r"^[-+]?(0|[1-9][0-9]*)$"

# Chart value (its path in the schema's properties) -> the daemon setting it becomes (its path
# in the configuration model; "[]" steps into a list's items). The template renders each.
GENERATED_LEAVES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("config", "intervalSeconds"): ("interval_seconds",),
    ("config", "logLevel"): ("log_level",),
    ("podAttribution", "mode"): ("kubernetes", "mode"),
    ("podAttribution", "refreshSeconds"): ("kubernetes", "refresh_seconds"),
    ("podAttribution", "timeoutSeconds"): ("kubernetes", "timeout_seconds"),
    ("podAttribution", "dra", "drivers"): ("kubernetes", "dra", "drivers"),
    ("podAttribution", "dra", "timeoutSeconds"): ("kubernetes", "dra", "timeout_seconds"),
    ("processAttribution", "refreshSeconds"): ("kubernetes", "processes", "refresh_seconds"),
    ("processAttribution", "timeoutSeconds"): ("kubernetes", "processes", "timeout_seconds"),
    ("rules", "evaluationIntervalSeconds"): ("rules", "evaluation_interval_seconds"),
    ("rules", "semantics"): ("rules", "semantics"),
    ("alerting", "alertmanagers", "[]", "timeoutSeconds"): (
        "alerting",
        "alertmanagers",
        "[]",
        "timeout_seconds",
    ),
    ("alerting", "externalLabels"): ("alerting", "external_labels"),
    ("alerting", "resendDelaySeconds"): ("alerting", "resend_delay_seconds"),
    ("alerting", "queueCapacity"): ("alerting", "queue_capacity"),
    ("dcgm", "mode"): ("dcgm", "mode"),
    ("dcgm", "address"): ("dcgm", "address"),
    ("dcgmCompat", "hostnameLabel"): ("dcgm_compat", "hostname_label"),
}
# Chart values among those where "" means "the daemon's default": the chart then leaves the
# setting out of the file, so the empty string is valid for the chart value although the
# daemon refuses it as the setting (its minLength is dropped; every other limit stays).
EMPTY_MEANS_DEFAULT: frozenset[tuple[str, ...]] = frozenset({("dcgm", "address")})
# Whole objects: chart value -> model.
GENERATED_OBJECTS: dict[tuple[str, ...], type[Any]] = {
    ("config", "nvml"): NvmlConfig,
    ("config", "metrics"): MetricsConfig,
    ("config", "extra"): Config,
}
_DROPPED = ("title", "default", "description")  # for people reading the model, not validators


def model_schema(model: type[Any]) -> dict[str, Any]:
    """The model's JSON schema, inlined and with numbers that accept numeric strings."""
    schema = model.model_json_schema()
    return _simplify(_inline(schema, schema.get("$defs", {})))


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        node = {**defs[ref.removeprefix("#/$defs/")], **node}
    return {key: _inline(value, defs) for key, value in node.items() if key != "$defs"}


def _simplify(node: Any) -> Any:
    if isinstance(node, list):
        return [_simplify(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _simplify(value) for key, value in node.items() if key not in _DROPPED}
    # `X | None`: one schema whose type also allows null (a clearer error than anyOf's).
    options = node.get("anyOf")
    if options and len(options) == 2 and {"type": "null"} in options:
        (other,) = [option for option in options if option != {"type": "null"}]
        kinds = other.get("type")
        if kinds is not None:
            del node["anyOf"]
            kinds = [kinds] if isinstance(kinds, str) else kinds
            node = {**node, **other, "type": [*kinds, "null"]}
    return _numeric_strings(node)


def _numeric_strings(node: dict[str, Any]) -> dict[str, Any]:
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if ("number" in kinds or "integer" in kinds) and "string" not in kinds:
        # minimum/maximum apply to numbers only and pattern to strings only (JSON Schema).
        node["type"] = [*kinds, "string"]
        node["pattern"] = NUMBER_STRING if "number" in kinds else INTEGER_STRING
    return node


def _at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The subschema for a value path: `properties` per key, `items` for "[]"."""
    for key in path:
        schema = schema["items"] if key == "[]" else schema["properties"][key]
    return schema


def generate(current: dict[str, Any]) -> dict[str, Any]:
    schema = json.loads(json.dumps(current))  # a copy; keys keep their order
    config = model_schema(Config)
    for chart_path, model in GENERATED_OBJECTS.items():
        parent = _at(schema, chart_path[:-1])["properties"]
        parent[chart_path[-1]] = {"$comment": COMMENT, **model_schema(model)}
    for chart_path, setting in GENERATED_LEAVES.items():
        parent = _at(schema, chart_path[:-1])["properties"]
        leaf = {"$comment": COMMENT, **_at(config, setting)}
        if chart_path in EMPTY_MEANS_DEFAULT:
            if leaf.get("type") != "string":
                raise SystemExit(f"{'.'.join(chart_path)}: an empty default needs a string")
            leaf.pop("minLength", None)
        parent[chart_path[-1]] = leaf
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a difference")
    args = parser.parse_args()
    current = SCHEMA_FILE.read_text()
    wanted = render(generate(json.loads(current)))
    if args.check:
        if current != wanted:
            print(
                f"{SCHEMA_FILE} is out of date: run scripts/gen-values-schema.py", file=sys.stderr
            )
            return 1
        return 0
    if current != wanted:
        SCHEMA_FILE.write_text(wanted)
        print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
