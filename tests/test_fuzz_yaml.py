"""Property-based tests of the YAML loader (hypothesis, derandomized: the same examples each run).

Whatever the input (random text, random bytes, generated YAML with anchors, aliases, merge
keys, nesting and keys of every kind), only `YamlFileError` escapes, its message names the
file, memory stays bounded, and what the loader accepts PyYAML reads to the same data.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.support import yamlfile
from gpu_exporter.support.yamlfile import MAX_DEPTH, YamlFileError, load_yaml, load_yaml_file

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# What an alias bomb can cost before the budget stops it: ALIAS_NODES_FLOOR values, ~2.5 MiB.
BOMB_PEAK_BYTES = 8 << 20


@pytest.fixture(params=["libyaml", "pure-python"], scope="module")
def parser(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both event sources the loader may run on (libyaml's, PyYAML's own)."""
    saved = yamlfile._EVENT_LOADER
    yamlfile._EVENT_LOADER = yaml.CSafeLoader if request.param == "libyaml" else yaml.SafeLoader
    yield request.param
    yamlfile._EVENT_LOADER = saved


def load_or_refuse(text: str) -> tuple[Any, str | None]:
    """(data, None) or (None, the error); anything else escaping fails the test."""
    try:
        return load_yaml(text, "f.yaml").data, None
    except YamlFileError as exc:
        message = str(exc)
        assert message.startswith("f.yaml"), message
        return None, message


def load_measured(text: str) -> tuple[Any, str | None, int]:
    """`load_or_refuse` and the peak of the memory it took (tracemalloc)."""
    tracemalloc.start()
    try:
        data, error = load_or_refuse(text)
        return data, error, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def comparable(value: Any) -> Any:
    """NaN equals NaN here, so that data can be compared with PyYAML's."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {comparable(k): comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(item) for item in value]
    return value


def agrees_with_pyyaml(text: str, data: Any) -> None:
    try:
        expected = yaml.safe_load(text)
    except (yaml.YAMLError, TypeError, ValueError, RecursionError):
        return  # PyYAML refuses (or breaks on) what the loader accepts: nothing to compare
    assert comparable(data) == comparable(expected), text


# -- strategies -----------------------------------------------------------------------------

YAML_CHARS = st.sampled_from(list("[]{}:,-?&*!|>'\"#%@`<=~. \n\t0123456789abcxyz\\"))
ANCHORS = ["a", "b", "c"]
SCALARS = st.sampled_from(
    [
        "x", "1", "-1.5", "1e3", "0x1F", "1:30", ".nan", ".inf", "~", "null", "true", "yes",
        "on", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-13-45", "'q'", '"d\\n"',
        "''", "<<", "=", "!!int 3", "!!str 3", "!!float x", "!!bool maybe", "!!binary aGk=",
        "!!binary %%%", "!foo x", "!!set {}", "! x", "!!null z",
    ]
)  # fmt: skip


def _decorated(fragment: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    anchored = st.tuples(st.sampled_from(ANCHORS), fragment).map(lambda p: f"&{p[0]} {p[1]}")
    return st.one_of(fragment, anchored)


def _collections(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    sequence = st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
    pair = st.tuples(children, children).map(lambda kv: f"? {kv[0]} : {kv[1]}")
    mapping = st.lists(pair, max_size=4).map(lambda pairs: "{" + ", ".join(pairs) + "}")
    return _decorated(st.one_of(sequence, mapping))


ALIASES = st.sampled_from([f"*{name}" for name in ANCHORS])
# Flow YAML with anchors and aliases anywhere, collections and aliases as keys, `<<` keys.
DOCUMENTS = st.recursive(st.one_of(_decorated(SCALARS), ALIASES), _collections, max_leaves=25)


@st.composite
def alias_chains(draw: st.DrawFn) -> str:
    """An alias bomb of some height and width (the canonical one is 9 by 9)."""
    levels, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    merge = draw(st.booleans())
    if merge:
        lines = [f"l0: &l0 {{{', '.join(f'x{i}: lol' for i in range(width))}}}"]
    else:
        lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        if merge:  # merges of the previous level, each under its own key
            items = ", ".join(f"k{i}: {{<<: *l{level - 1}}}" for i in range(width))
            lines.append(f"l{level}: &l{level} {{{items}}}")
        else:
            lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@st.composite
def nestings(draw: st.DrawFn) -> str:
    depth = draw(st.integers(0, 3 * MAX_DEPTH))
    if draw(st.booleans()):
        return "[" * depth + "]" * depth
    return "".join("  " * i + "- \n" for i in range(depth)) or "x"


# -- properties -----------------------------------------------------------------------------


@FUZZ
@given(text=st.text(YAML_CHARS, max_size=200) | st.text(max_size=100))
def test_random_text_gives_data_or_a_yaml_file_error(parser: str, text: str) -> None:
    data, error = load_or_refuse(text)
    if error is None:
        agrees_with_pyyaml(text, data)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Module-scoped: hypothesis runs many examples per call of a function-scoped fixture.
    return tmp_path_factory.mktemp("fuzz-yaml")


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_in_a_file_give_data_or_a_yaml_file_error(
    parser: str, files: Path, data: bytes
) -> None:
    path = files / "fuzz.yaml"
    path.write_bytes(data)
    try:
        load_yaml_file(path)
    except YamlFileError as exc:
        assert str(exc).startswith(str(path)), exc


@FUZZ
@given(text=DOCUMENTS)
def test_generated_documents_give_pyyamls_data_or_a_yaml_file_error(parser: str, text: str) -> None:
    data, error = load_or_refuse(text)
    if error is None:
        agrees_with_pyyaml(text, data)
    else:
        assert error.startswith("f.yaml:1"), error  # a one-line document: line 1


@settings(FUZZ, max_examples=30)  # each up to ALIAS_NODES_FLOOR values, traced
@given(text=alias_chains())
def test_alias_chains_load_or_are_refused_within_bounded_memory(text: str) -> None:
    # Aliases are expanded after parsing: one parser is enough.
    data, error, peak = load_measured(text)
    assert peak < BOMB_PEAK_BYTES
    if error is None:
        agrees_with_pyyaml(text, data)
    else:
        assert "aliases expand to more than" in error


@settings(FUZZ, max_examples=100)
@given(text=nestings())
def test_nesting_loads_up_to_the_limit_and_is_refused_past_it(parser: str, text: str) -> None:
    depth = max(text.count("["), text.count("-"))
    data, error = load_or_refuse(text)
    if depth <= MAX_DEPTH:
        assert error is None, error
        agrees_with_pyyaml(text, data)
    else:
        assert error is not None and error.endswith(f"nested more than {MAX_DEPTH} levels deep")
