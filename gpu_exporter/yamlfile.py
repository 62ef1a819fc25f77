"""YAML loading that remembers where each value was written, for errors a person can act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


class YamlFileError(ValueError):
    """A YAML file that cannot be parsed at all; the message names the file and the line."""


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


def load_yaml(text: str, filename: str) -> LocatedYaml:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlFileError(f"{filename}{line}: invalid YAML: {problem}") from exc
    located = LocatedYaml(None, filename)
    if node is not None:
        located.data = _Converter(yaml.SafeLoader(""), located).convert(node, ())
    return located


def load_yaml_file(path: str | Path) -> LocatedYaml:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    return load_yaml(text, str(path))


class _Converter:
    """Turns composed nodes into Python values (YAML's own scalar typing) and records lines."""

    def __init__(self, loader: yaml.SafeLoader, located: LocatedYaml) -> None:
        self.loader, self.located = loader, located

    def convert(self, node: yaml.Node, path: Path_) -> Any:
        self.located.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node, deep=True)
                child = (*path, key)
                if key in out:
                    where = self.located.where(child)
                    raise YamlFileError(
                        f"{where}: duplicate key (line {key_node.start_mark.line + 1})"
                    )
                self.located.lines[child] = key_node.start_mark.line + 1
                out[key] = self.convert(value_node, child)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
        return self.loader.construct_object(node, deep=True)
