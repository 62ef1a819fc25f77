"""A static estimate of what one expansion of a template may cost, for `rules check`.

template.py's budgets bound one expansion (STEP_LIMIT steps, BUILD_LIMIT characters), but a
rule group expands each annotation of each alert at every evaluation, so a template that
spends thousands of steps per alert takes seconds over a node's alerts: the group's time
budget then stops it and marks the annotation (alerts.TEMPLATE_STOPPED). Most of that cost
comes from text that grows through nested calls: `reReplaceAll "(.)" "$1$1"` doubles its
input and takes a step per match, so six of them nested run 63 steps per character of the
innermost text. The estimate follows the text's length through the template:

* a label, `.`, or a field is LABEL_CHARS characters (a pod name may have 63); `$value` is a
  number; a literal is its own length; a variable what was assigned to it;
* `reReplaceAll` takes a step per character of its input (every character a match, at worst)
  and returns it times the replacement's growth: its group references, plus one for literal
  text (a replacement that is not a literal: 2);
* `printf` returns its arguments, its format and its widths; other functions their
  arguments;
* `range` runs its body LABELS_PER_SERIES times; `if` / `with` cost their dearer branch.

A template over COSTLY_STEPS steps by that estimate is reported. It is an estimate: labels
longer than assumed cost more, a pattern that matches rarely costs less.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter.alerting.rules import template

LABEL_CHARS = 64  # characters a label value is assumed to have
NUMBER_CHARS = 24  # `$value` and other numbers as text, at most
LABELS_PER_SERIES = 16  # what a `range` over a label map is assumed to visit
COSTLY_STEPS = template.STEP_LIMIT // 4  # past this, `rules check` warns

# A reference in reReplaceAll's replacement: $1, ${1}, $name, ${name} ($$ is a literal $).
_REFERENCE = re.compile(r"\$(?:\{[^}]*\}|[0-9A-Za-z_]+)")
# A printf width or precision: the digits after % and flags, or after the dot.
_WIDTH = re.compile(r"%[-+# 0]*(\d*)(?:\.(\d+))?")


@dataclass(frozen=True)
class Cost:
    """One expansion, estimated: steps run, and how the longest text grew on the way."""

    steps: int
    growth: int  # the product of the growths of the amplifying calls nested on the worst path
    amplifiers: tuple[str, ...]  # those calls, outermost first, e.g. ("reReplaceAll x2", ...)

    @property
    def costly(self) -> bool:
        return self.steps >= COSTLY_STEPS

    def describe(self) -> str:
        """Why it costs that much, for `rules check`."""
        grows = ""
        if self.growth > 1:
            names = sorted(set(self.amplifiers), key=self.amplifiers.index)
            count = len(self.amplifiers)
            grows = (
                f"; its text grows {self.growth}-fold through {count} nested "
                f"{'call' if count == 1 else 'calls'} that amplify it ({', '.join(names)})"
            )
        return (
            f"one expansion may run about {self.steps:,} steps with {LABEL_CHARS}-character "
            f"labels{grows}; each alert expands it at every evaluation, and past the group's "
            f"time budget it is stopped and marked"
        )


@dataclass(frozen=True)
class _Text:
    """A value as the estimate sees it: its length and how it grew."""

    chars: int
    growth: int = 1
    amplifiers: tuple[str, ...] = ()


def estimate(text: str) -> Cost:
    """The estimated cost of one expansion of `text` (a template that template.check accepts;
    raises TemplateError otherwise)."""
    template.check(text)
    walk = _Walk()
    walk.nodes(template._compile(text))
    return Cost(walk.steps, walk.worst.growth, walk.worst.amplifiers)


class _Walk:
    def __init__(self) -> None:
        self.steps = 0
        self.vars: dict[str, _Text] = {"$value": _Text(NUMBER_CHARS)}
        self.worst = _Text(0)  # the most grown value seen

    def nodes(self, nodes: Sequence[Any]) -> None:
        for node in nodes:
            self.steps += 1
            if isinstance(node, template._Action):
                self.pipe(node.pipe)
            elif isinstance(node, template._Control):
                self.control(node)

    def control(self, node: Any) -> None:
        self.pipe(node.pipe)
        before = self.steps
        self.nodes(node.body)
        body = self.steps - before
        if node.kind == "range":
            self.steps += (body + 1) * (LABELS_PER_SERIES - 1)  # the body ran once already
        if node.else_body is not None:
            before = self.steps
            self.nodes(node.else_body)
            other = self.steps - before
            self.steps -= min(body, other)  # one branch runs: the dearer one is counted

    def pipe(self, pipe: Any) -> _Text:
        value: _Text | None = None
        for cmd in pipe.cmds:
            self.steps += 1
            value = self.command(cmd, value)
        result = value or _Text(0)
        for name in pipe.decl:
            self.vars[name] = result
        return result

    def command(self, cmd: Any, final: _Text | None) -> _Text:
        first, args = cmd.args[0], cmd.args[1:]
        if isinstance(first, template._FuncNode):
            return self.call(first.name, args, final)
        return self.operand(first)

    def operand(self, node: Any) -> _Text:
        if isinstance(node, template._Lit):
            return _Text(len(str(node.value)))
        if isinstance(node, template._VarNode) and not node.names and node.name in self.vars:
            return self.vars[node.name]
        if isinstance(node, template._Pipe):
            return self.pipe(node)
        if isinstance(node, template._FuncNode):
            return self.call(node.name, (), None)
        return _Text(LABEL_CHARS)  # a label, `.`, a field: label data

    def call(self, name: str, args: Sequence[Any], final: _Text | None) -> _Text:
        values = [self.operand(arg) for arg in args] + ([final] if final is not None else [])
        if not values:
            return _Text(NUMBER_CHARS)
        widest = max(values, key=lambda value: (value.growth, value.chars))
        if name == "reReplaceAll" and len(values) == 3:
            subject = values[2]
            self.steps += subject.chars  # a match per character, at worst
            growth = _replacement_growth(args[1] if len(args) > 1 else None)
            amplifiers = subject.amplifiers
            if growth > 1:
                amplifiers = (f"reReplaceAll x{growth}", *amplifiers)
            result = _Text(subject.chars * growth, subject.growth * growth, amplifiers)
        elif name == "printf" and isinstance(args[0], template._Lit):
            widths = sum(int(w or 0) + int(p or 0) for w, p in _WIDTH.findall(str(args[0].value)))
            chars = sum(value.chars for value in values) + widths
            result = _Text(chars, widest.growth, widest.amplifiers)
        else:
            result = _Text(sum(value.chars for value in values), widest.growth, widest.amplifiers)
        if (result.growth, result.chars) > (self.worst.growth, self.worst.chars):
            self.worst = result
        return result


def _replacement_growth(node: Any) -> int:
    """How many times reReplaceAll's replacement may multiply its input: its references (each
    copies a match) plus one for literal text; 2 when it is not a literal."""
    if not isinstance(node, template._Lit) or not isinstance(node.value, str):
        return 2
    text = node.value.replace("$$", "")
    references = len(_REFERENCE.findall(text))
    literal = bool(_REFERENCE.sub("", text))
    return max(1, references + literal)
