"""The one YAML loader: limits against hostile files, and the line of every value for errors.

Every YAML file the daemon reads goes through `load_yaml_file`: the configuration, rule files,
rule unit-test files, scenarios and the web-config file. It reads the YAML 1.1 that PyYAML's
SafeLoader reads (anchors, aliases and `<<` merge keys included), within limits that keep a
broken or hostile file from costing more than a little memory and time:

- `MAX_FILE_BYTES`: at most this much is read, and only from a regular file (a device such as
  /dev/zero never ends; a FIFO without a writer blocks its reader forever).
- `MAX_DEPTH`: nesting, counted on the parser's events, before anything recursive runs.
- `MAX_NODES`: values in the document, aliases expanded.
- Aliases may add at most as many values as the file writes itself, or `ALIAS_NODES_FLOOR` if
  that is more: shared label sets are fine, a "billion laughs" (aliases of aliases of ...: a
  few hundred bytes for a billion values) is refused after ten thousand.

Every problem is a `YamlFileError` whose message starts `file:line:`.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

Path_ = tuple[str | int, ...]

# 1 MiB: 50 times the shipped rule pack (20 KiB), far above any configuration, rule file or
# scenario seen in practice, small enough to parse in well under a second.
MAX_FILE_BYTES = 1 << 20
# The deepest real file (a scenario's devices[].values.x.steps[][]) nests 6 levels.
MAX_DEPTH = 64
# About 250 bytes each while loading (measured with tracemalloc): 25 MiB at most. A value is a
# scalar, a list or a mapping; the shipped rule pack has about 1,500.
MAX_NODES = 100_000
ALIAS_NODES_FLOOR = 10_000
# Python's own limit for int(str) (sys.int_info.default_max_str_digits); also bounds the
# arithmetic of YAML 1.1 base-60 numbers (`1:30:00`), which Python's limit does not cover.
MAX_NUMBER_CHARS = sys.int_info.default_max_str_digits

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"  # a plain `=`
_MAP_TAGS = (None, "!", Resolver.DEFAULT_MAPPING_TAG)
_SEQ_TAGS = (None, "!", Resolver.DEFAULT_SEQUENCE_TAG)
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_SCALAR_CONSTRUCTORS = {
    tag: SafeConstructor.yaml_constructors[tag]
    for tag in (
        "tag:yaml.org,2002:null",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:binary",
        "tag:yaml.org,2002:timestamp",
        "tag:yaml.org,2002:str",
    )
}
# libyaml's parser when PyYAML was built with it (10 times faster), else PyYAML's own.
_EVENT_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlFileError(ValueError):
    """A YAML file that cannot be loaded at all; the message names the file and the line."""


@dataclass
class LocatedYaml:
    """Plain Python data plus the 1-based line of every mapping key and sequence item."""

    data: Any
    filename: str
    lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def where(self, path: Path_) -> str:
        """`file:LINE: a.b[2].c` (compiler style, so editors can jump to it)."""
        line = self.line_of(path)
        location = f"{self.filename}:{line}" if line else self.filename
        return f"{location}: {format_path(path)}"


def format_path(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_yaml_file(path: str | Path) -> LocatedYaml:
    return load_yaml(_decode(read_bounded(path), path), str(path))


def read_bounded(path: str | Path) -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES; YamlFileError otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or exc
        raise YamlFileError(f"{path}: cannot read: {reason}") from None
    try:
        kind = _file_kind(os.fstat(fd).st_mode)
        if kind:
            raise YamlFileError(f"{path}: cannot read: {kind}, not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_FILE_BYTES:
        raise YamlFileError(_too_large(path))
    return data


def _file_kind(mode: int) -> str | None:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a file"


def _too_large(path: str | Path) -> str:
    return f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, the limit for a YAML file"


def _decode(data: bytes, path: str | Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise YamlFileError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def load_yaml(text: str, filename: str) -> LocatedYaml:
    """One document from `text`, within the limits above; YamlFileError for any problem."""
    if len(text) > MAX_FILE_BYTES:  # characters: fewer than bytes, so a cheap first test
        raise YamlFileError(_too_large(filename))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        raise YamlFileError(f"{filename}:{line}: not UTF-8 text (character {exc.start})") from None
    if size > MAX_FILE_BYTES:
        raise YamlFileError(_too_large(filename))
    composer = _Composer(filename)
    root = composer.compose(text)
    located = LocatedYaml(None, filename)
    if root is not None:
        located.data = _Converter(located, composer.written).convert(root, (), 0, None)
    return located


# ---------------------------------------------------------------------------------------------
# Events -> nodes: iterative, so depth is checked before anything can recurse.


class _Scalar:
    __slots__ = ("line", "tag", "value")

    def __init__(self, tag: str, value: str, line: int) -> None:
        self.tag, self.value, self.line = tag, value, line


class _Collection:
    __slots__ = ("is_mapping", "items", "line")

    def __init__(self, is_mapping: bool, line: int) -> None:
        # A mapping's items alternate key, value.
        self.is_mapping, self.line = is_mapping, line
        self.items: list[_Node] = []


class _Alias:
    __slots__ = ("line", "target")

    def __init__(self, target: _Scalar | _Collection, line: int) -> None:
        self.target, self.line = target, line


_Node = _Scalar | _Collection | _Alias


class _Composer:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.written = 0  # nodes the file writes itself (aliases not expanded)
        self.resolver = Resolver()

    def error(self, line: int | None, message: str) -> YamlFileError:
        where = f"{self.filename}:{line}" if line else self.filename
        return YamlFileError(f"{where}: {message}")

    def compose(self, text: str) -> _Node | None:
        root: _Node | None = None
        documents = 0
        open_nodes: list[tuple[_Collection, str | None]] = []  # with their anchors
        anchors: dict[str, _Scalar | _Collection] = {}
        node: _Node
        for event in self._events(text):
            line = event.start_mark.line + 1 if event.start_mark else 0
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self.error(line, "a second document (`---`); this file holds one")
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                node, anchor = open_nodes.pop()
                if anchor is not None:
                    anchors[anchor] = node
            elif isinstance(event, yaml.AliasEvent):
                node = self._alias(event, anchors, open_nodes, line)
            elif isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
                self.written += 1
                if self.written > MAX_NODES:
                    raise self.error(line, f"more than {MAX_NODES} values in one file")
                if isinstance(event, yaml.ScalarEvent):
                    node = _Scalar(self._scalar_tag(event, line), event.value, line)
                    if event.anchor is not None:
                        anchors[event.anchor] = node
                else:
                    if len(open_nodes) >= MAX_DEPTH:
                        raise self.error(line, f"nested more than {MAX_DEPTH} levels deep")
                    mapping = isinstance(event, yaml.MappingStartEvent)
                    if event.tag not in (_MAP_TAGS if mapping else _SEQ_TAGS):
                        raise self.error(line, f"unsupported tag {event.tag}")
                    open_nodes.append((_Collection(mapping, line), event.anchor))
                    continue
            else:  # stream start and end, document end
                continue
            if open_nodes:
                open_nodes[-1][0].items.append(node)
            else:
                root = node
        return root

    def _events(self, text: str) -> Iterator[yaml.Event]:
        parser = None
        try:
            parser = _EVENT_LOADER(text)  # PyYAML's reader checks the characters here
            while parser.check_event():
                yield parser.get_event()
        except yaml.YAMLError as exc:
            line = _error_line(exc, text)
            if "maximum nesting depth" in str(exc):  # libyaml's own limit, 1000 levels
                raise self.error(line, f"nested more than {MAX_DEPTH} levels deep") from None
            raise self.error(line, f"invalid YAML: {_problem(exc)}") from None
        finally:
            if parser is not None:
                parser.dispose()

    def _alias(
        self,
        event: yaml.AliasEvent,
        anchors: dict[str, _Scalar | _Collection],
        open_nodes: list[tuple[_Collection, str | None]],
        line: int,
    ) -> _Alias:
        target = anchors.get(event.anchor or "")
        if target is not None:
            return _Alias(target, line)
        if any(anchor == event.anchor for _, anchor in open_nodes):
            raise self.error(line, f"alias *{event.anchor} is inside its own anchor")
        raise self.error(line, f"alias *{event.anchor} has no anchor &{event.anchor} before it")

    def _scalar_tag(self, event: yaml.ScalarEvent, line: int) -> str:
        if event.tag in (None, "!"):
            return str(self.resolver.resolve(yaml.ScalarNode, event.value, event.implicit))
        if event.tag in _SCALAR_CONSTRUCTORS or event.tag in (_MERGE_TAG, _VALUE_TAG):
            return str(event.tag)
        raise self.error(line, f"unsupported tag {event.tag}")


def _error_line(exc: yaml.YAMLError, text: str) -> int | None:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return int(mark.line) + 1
    position = getattr(exc, "position", None)  # a ReaderError: bad character at this offset
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return None


def _problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"character U+{code:04X} is not allowed ({exc.reason})"
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"{problem} ({context})" if context else str(problem)


# ---------------------------------------------------------------------------------------------
# Nodes -> Python values, aliases expanded within the budget, lines recorded.


class _Converter:
    def __init__(self, located: LocatedYaml, written: int) -> None:
        self.located = located
        self.constructor = SafeConstructor()
        self.nodes = 0
        self.aliased = 0  # nodes reached through an alias
        self.alias_budget = max(ALIAS_NODES_FLOOR, written)

    def error(self, line: int, path: Path_, message: str) -> YamlFileError:
        where = f"{self.located.filename}:{line}: {format_path(path)}"
        return YamlFileError(f"{where}: {message}")

    def convert(self, node: _Node, path: Path_, depth: int, alias: _Alias | None) -> Any:
        """`alias`: the alias use this node was reached through (for the budget's error)."""
        if isinstance(node, _Alias):
            self.located.lines.setdefault(path, node.line)
            return self.convert(node.target, path, depth, alias or node)
        self.located.lines.setdefault(path, node.line)
        self._count(node, path, alias)
        if isinstance(node, _Scalar):
            return self._scalar(node, path)
        if depth >= MAX_DEPTH:
            at = alias.line if alias else node.line
            raise self.error(
                at, path, f"nested more than {MAX_DEPTH} levels deep (aliases expanded)"
            )
        if node.is_mapping:
            return self._mapping(node, path, depth, alias)
        return [
            self.convert(item, (*path, i), depth + 1, alias) for i, item in enumerate(node.items)
        ]

    def _count(self, node: _Scalar | _Collection, path: Path_, alias: _Alias | None) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.error(node.line, path, f"more than {MAX_NODES} values, aliases expanded")
        if alias is not None:
            self.aliased += 1
            if self.aliased > self.alias_budget:
                raise self.error(
                    alias.line,
                    path,
                    f"aliases expand to more than {self.alias_budget} values (the larger of "
                    f"{ALIAS_NODES_FLOOR} and the values the file writes itself)",
                )

    def _mapping(
        self, node: _Collection, path: Path_, depth: int, alias: _Alias | None
    ) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        merge: tuple[_Node, int] | None = None
        explicit: list[tuple[Any, int, _Node]] = []
        first_line: dict[Any, int] = {}
        for key_node, value_node in zip(node.items[::2], node.items[1::2], strict=True):
            key_scalar = key_node.target if isinstance(key_node, _Alias) else key_node
            if not isinstance(key_scalar, _Scalar):
                kind = "mapping" if key_scalar.is_mapping else "list"
                raise self.error(
                    key_node.line, path, f"a {kind} as a mapping key (a key is a single value)"
                )
            self._count(key_scalar, path, alias)
            if key_scalar.tag == _MERGE_TAG:
                if merge is not None:
                    raise self.error(
                        key_node.line, path, f"a second `<<` (first at line {merge[1]})"
                    )
                merge = (value_node, key_node.line)
                continue
            key = self._scalar(key_scalar, path)
            if key in first_line:
                raise self.error(
                    key_node.line,
                    (*path, key),
                    f"duplicate key (first at line {first_line[key]})",
                )
            first_line[key] = key_node.line
            explicit.append((key, key_node.line, value_node))
        if merge is not None:
            # YAML 1.1 merge: keys written here win, then the first merged mapping's, ...
            for source in reversed(self._merge_sources(*merge, path)):
                out.update(self.convert(source, path, depth, alias))
        for key, line, value_node in explicit:
            self.located.lines[(*path, key)] = line
            out[key] = self.convert(value_node, (*path, key), depth + 1, alias)
        return out

    def _merge_sources(self, value: _Node, line: int, path: Path_) -> list[_Node]:
        def is_mapping(node: _Node) -> bool:
            target = node.target if isinstance(node, _Alias) else node
            return isinstance(target, _Collection) and target.is_mapping

        if is_mapping(value):
            return [value]
        target = value.target if isinstance(value, _Alias) else value
        if isinstance(target, _Collection) and all(is_mapping(item) for item in target.items):
            return list(target.items)
        raise self.error(line, path, "`<<` merges a mapping or a list of mappings")

    def _scalar(self, node: _Scalar, path: Path_) -> Any:
        if node.tag in (_MERGE_TAG, _VALUE_TAG):
            return node.value  # `<<` or `=` as a value: the text itself
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            raise self.error(node.line, path, f"a number longer than {MAX_NUMBER_CHARS} characters")
        construct = _SCALAR_CONSTRUCTORS[node.tag]
        try:
            return construct(self.constructor, yaml.ScalarNode(node.tag, node.value))
        except Exception as exc:  # one string's conversion: any failure means a bad value
            short = node.value if len(node.value) <= 40 else node.value[:40] + "..."
            reason = "" if isinstance(exc, KeyError) else f": {exc}"
            kind = node.tag.rsplit(":", 1)[-1]
            raise self.error(node.line, path, f"invalid {kind} {short!r}{reason}") from None
