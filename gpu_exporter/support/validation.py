"""Pydantic models fed by the bounded YAML loader, with errors that name `file:line: field`.

Every YAML file the daemon reads (configuration, scenario, web-config, rule files) is loaded by
`yamlfile.load_yaml_file` and then validated by a pydantic model through `validate` here; a
problem becomes one line `file:LINE: a.b[2].c: message` (compiler style, so editors can jump to
it), the line being that of the value, or of its nearest ancestor the file writes.

Each kind of file keeps the words its users already know for the few structural errors pydantic
phrases itself (an unknown key, a missing one, a mapping expected): `Wording` says them. Every
other message is the model's own: a validator's `ValueError` text, or a `PydanticCustomError`
raised with the exact sentence.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Tag, ValidationError

from gpu_exporter.support.yamlfile import LocatedYaml, Path_, format_path

Model = TypeVar("Model", bound=BaseModel)

# Pydantic's error types for "a mapping was expected" and "a list was expected".
_MAPPING_TYPES = frozenset({"model_type", "dict_type", "model_attributes_type"})
_LIST_TYPES = frozenset({"list_type", "tuple_type", "set_type", "frozen_set_type"})


@dataclass(frozen=True)
class Wording:
    """How one kind of file words pydantic's structural errors; `{key}`, `{known}`, `{kind}`
    are filled in (the key, the known keys comma-separated, what the file wrote instead).
    None: pydantic's own message."""

    unknown_key: str = "unknown field"
    missing_key: str | None = "missing required field {key!r}"
    not_a_mapping: str | None = "expected a mapping, got {kind}"
    not_a_list: str | None = "expected a list, got {kind}"


DEFAULT_WORDING = Wording()


class SettingsModel(BaseModel):
    """One section of the daemon's settings. An unknown key is an error (a misspelt setting must
    not be ignored), and a validated section never changes: the threads that read it share it.
    No float setting may be NaN or infinite: every bound is false for NaN, so pydantic would
    report `.nan` as past whichever bound it checks first ("less than or equal to 3600")."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def split_commas(value: Any) -> Any:
    """A list given as one string, as environment variables give lists: `a.yaml,b/*.yaml`
    (a before-validator; anything else is left to the field's type)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class InputError(ValueError):
    """An input file that does not validate: one `file:line: field: message` line each."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def validate(
    model: type[Model],
    located: LocatedYaml,
    *,
    wording: Wording = DEFAULT_WORDING,
    context: Mapping[str, Any] | None = None,
    first_only: bool = False,
) -> Model:
    """`located.data` as a `model`; InputError naming file, line and field otherwise.

    `context` reaches the validators (`info.context`): what a file is checked against that the
    model cannot know by itself (the functions a fake library implements, say).
    """
    try:
        return model.model_validate(located.data, context=dict(context or {}))
    except ValidationError as exc:
        problems = describe(exc.errors(), located, model, wording)
        raise InputError(problems[:1] if first_only else problems) from None


def describe(
    errors: Iterable[Mapping[str, Any]],
    located: LocatedYaml,
    model: type[BaseModel],
    wording: Wording = DEFAULT_WORDING,
) -> list[str]:
    """One `file:line: field: message` line per pydantic error."""
    out: list[str] = []
    for err in errors:
        path, message = explain(err, located.data, model, wording)
        line = located.line_of(path)
        where = f"{located.filename}:{line}" if line else located.filename
        text = f"{where}: {format_path(path)}: {message}"
        if text not in out:  # a union reports one problem once per member
            out.append(text)
    return out


def explain(
    err: Mapping[str, Any],
    data: Any,
    model: type[BaseModel],
    wording: Wording = DEFAULT_WORDING,
) -> tuple[Path_, str]:
    """(the path in the file's data, the message) of one pydantic error of `model`."""
    kind = str(err["type"])
    raw_loc = tuple(err["loc"])
    loc = _walk(model, raw_loc)[0]
    path = data_path(loc, data, missing=kind == "missing")
    value = err.get("input")
    if kind == "extra_forbidden":
        known = ", ".join(sorted(_field_names(_walk(model, raw_loc[:-1])[1])))
        return path, wording.unknown_key.format(key=path[-1] if path else "", known=known)
    if kind == "missing" and wording.missing_key is not None:
        return path[:-1], wording.missing_key.format(key=path[-1] if path else "")
    if kind in _MAPPING_TYPES and wording.not_a_mapping is not None:
        return path, wording.not_a_mapping.format(kind=kind_of(value))
    if kind in _LIST_TYPES and wording.not_a_list is not None:
        return path, wording.not_a_list.format(kind=kind_of(value))
    if kind == "finite_number":  # NaN or an infinity (SettingsModel refuses them)
        return path, f"must be a finite number, got {value}"
    return path, str(err["msg"]).removeprefix("Value error, ")


def data_path(loc: Path_, data: Any, missing: bool = False) -> Path_:
    """Pydantic's `loc` as a path through the file's data: the names it adds of its own (a
    tagged union's tag, a validator's wrapper, `[key]`) are dropped. A missing key is kept
    as the last element."""
    path: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        found, child = _child(node, part)
        if found:
            path.append(part)
            node = child
        elif i == len(loc) - 1 and (missing or isinstance(node, Mapping)) and part != "[key]":
            path.append(part)  # a missing key, or an unknown key pydantic names
    return tuple(path)


def _child(node: Any, part: str | int) -> tuple[bool, Any]:
    if isinstance(node, Mapping) and part in node:
        return True, node[part]
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return True, node[part]
    return False, None


def _walk(model: type[BaseModel], loc: Path_) -> tuple[Path_, list[Any]]:
    """Pydantic's `loc` without the tags of tagged unions (they name a member, not a key of
    the file), and the types found at its end."""
    kinds: list[Any] = [model]
    clean: list[str | int] = []
    for part in loc:
        members = [member for kind in kinds for member in _members(kind)]
        tagged = [kind for kind, tag in members if tag is not None and tag == part]
        if not tagged:
            tagged = [
                kind
                for kind, _ in members
                if _is_model(kind) and _field(kind, part) is None and _literal_tag(kind, part)
            ]
        if tagged:
            kinds = tagged
            continue
        clean.append(part)
        following: list[Any] = []
        for kind, _ in members:
            origin, args = typing.get_origin(kind), typing.get_args(kind)
            if _is_model(kind):
                field = _field(kind, part)
                if field is not None:
                    following.append(field.annotation)
            elif isinstance(part, int) and origin in (list, tuple, Sequence) and args:
                following.append(args[0])
            elif origin in (dict, Mapping) and len(args) == 2:
                following.append(args[1])
        kinds = following
    return tuple(clean), kinds


def _field_names(kinds: list[Any]) -> set[str]:
    names: set[str] = set()
    for kind, _ in (member for k in kinds for member in _members(k)):
        if _is_model(kind):
            names |= {f.alias or name for name, f in kind.model_fields.items()}
    return names


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _literal_tag(model: type[BaseModel], tag: str | int) -> bool:
    """Whether `tag` is the value of one of the model's Literal fields (a union's tag)."""
    return any(
        typing.get_origin(field.annotation) is Literal and tag in typing.get_args(field.annotation)
        for field in model.model_fields.values()
    )


def _field(model: type[BaseModel], key: str | int) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _members(kind: Any, tag: str | None = None) -> list[tuple[Any, str | None]]:
    """A type without Annotated, Optional or Union around it: its members, each with the Tag
    it has in a tagged union (None: untagged)."""
    origin = typing.get_origin(kind)
    if origin is typing.Annotated:
        base, *metadata = typing.get_args(kind)
        tags = [m.tag for m in metadata if isinstance(m, Tag)]
        return _members(base, tags[0] if tags else tag)
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(kind) for m in _members(arg)]
    return [(kind, tag)]


def kind_of(value: Any) -> str:
    """What a value is, for a person: "a mapping", "a list", "nothing", "str 'x'"."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
