"""Execute a parsed Go template (gotemplate_parse) the way text/template does, with Ollama's functions (pure).

Rules kept from text/template's exec.go: variables are scoped to the enclosing if/range/with body; `and` / `or`
short-circuit and return an operand; `eq` compares basic values of one kind; a missing key of a map is the zero
value (Ollama parses with missingkey=zero), a missing struct field an error; ranging over nil runs `else`.
The output is recorded in pieces, with a mark where each range iteration starts, so a caller can cut the prompt at
message boundaries and cache their token counts.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from gateway.tokens.gotemplate_parse import (
    Action,
    Branch,
    Chain,
    Field,
    Ident,
    Jump,
    Literal,
    Pipe,
    TemplateError,
    Text,
    Variable,
)
from gateway.tokens.gotemplate_values import GoList, GoMap, GoStruct, go_json, go_print, truth

_MAX_STEPS = 5_000_000


class _Jump(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


class Execution:
    """One run of a template over `data`; `out` holds the printed pieces, `marks` the piece index of each range
    iteration's start."""

    def __init__(self, data: Any, *, today: dt.date) -> None:
        self.root = data
        self.today = today
        self.out: list[str] = []
        self.marks: list[int] = []
        self.vars: list[tuple[str, Any]] = [("$", data)]
        self.steps = 0

    def run(self, nodes: Sequence[Any]) -> str:
        try:
            self.walk(nodes, self.root)
        except _Jump as exc:
            raise TemplateError(f"{{{{{exc.kind}}}}} outside range") from None
        except RecursionError as exc:
            raise TemplateError("template nests too deeply") from exc
        return "".join(self.out)

    def segments(self) -> list[str]:
        """The output cut at each range iteration's start (empty pieces dropped)."""
        cuts = [0, *self.marks, len(self.out)]
        pieces = ("".join(self.out[a:b]) for a, b in itertools.pairwise(cuts))
        return [p for p in pieces if p]

    def walk(self, nodes: Sequence[Any], dot: Any) -> None:
        for node in nodes:
            self.steps += 1
            if self.steps > _MAX_STEPS:
                raise TemplateError("template runs too long")
            if isinstance(node, Text):
                self.out.append(node.text)
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot)
                if not node.pipe.decl:
                    self.out.append(go_print(value))
            elif isinstance(node, Branch):
                self.branch(node, dot)
            elif isinstance(node, Jump):
                raise _Jump(node.kind)
            else:
                raise TemplateError(f"unknown node {type(node).__name__}")

    def scoped(self, nodes: Sequence[Any], dot: Any) -> None:
        mark = len(self.vars)
        try:
            self.walk(nodes, dot)
        finally:
            del self.vars[mark:]

    def branch(self, node: Branch, dot: Any) -> None:
        mark = len(self.vars)
        try:
            if node.kind == "range":
                self.range(node, dot)
                return
            value = self.pipe(node.pipe, dot)
            if truth(value):
                self.scoped(node.body, value if node.kind == "with" else dot)
            elif node.orelse is not None:
                self.scoped(node.orelse, dot)
        finally:
            del self.vars[mark:]

    def range(self, node: Branch, dot: Any) -> None:
        value = self.pipe(Pipe((), False, node.pipe.cmds), dot)
        items = _range_items(value)
        if not items:
            if node.orelse is not None:
                self.scoped(node.orelse, dot)
            return
        decl = node.pipe.decl
        for key, item in items:
            self.marks.append(len(self.out))
            mark = len(self.vars)
            if len(decl) == 1:
                self.vars.append((decl[0], item))
            elif len(decl) == 2:
                self.vars.extend(((decl[0], key), (decl[1], item)))
            try:
                self.walk(node.body, item)
            except _Jump as jump:
                if jump.kind == "break":
                    break
            finally:
                del self.vars[mark:]

    def pipe(self, pipe: Pipe, dot: Any) -> Any:
        value: Any = _NO_FINAL
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, value)
        for name in pipe.decl:
            if pipe.assign:
                self.set_var(name, value)
            else:
                self.vars.append((name, value))
        return value

    def command(self, cmd: tuple[Any, ...], dot: Any, final: Any) -> Any:
        head, args = cmd[0], cmd[1:]
        if isinstance(head, Ident):
            return self.call(head.name, args, dot, final)
        if args or final is not _NO_FINAL:
            raise TemplateError(f"can't give argument to non-function {head!r}")
        return self.arg(head, dot)

    def arg(self, node: Any, dot: Any) -> Any:
        if isinstance(node, Field):
            return _fields(dot, node.names)
        if isinstance(node, Variable):
            return _fields(self.get_var(node.name), node.names)
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Pipe):
            return self.pipe(node, dot)
        if isinstance(node, Chain):
            return _fields(self.pipe(node.node, dot), node.names)
        if isinstance(node, Ident):
            return self.call(node.name, (), dot, _NO_FINAL)
        raise TemplateError(f"unexpected operand {node!r}")

    def get_var(self, name: str) -> Any:
        for var, value in reversed(self.vars):
            if var == name:
                return value
        raise TemplateError(f"undefined variable {name}")

    def set_var(self, name: str, value: Any) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise TemplateError(f"undefined variable {name}")

    def call(self, name: str, args: Sequence[Any], dot: Any, final: Any) -> Any:
        if name in ("and", "or"):
            return self.logic(name, args, dot, final)
        values = [self.arg(a, dot) for a in args]
        if final is not _NO_FINAL:
            values.append(final)
        function = _FUNCTIONS.get(name)
        if function is not None:
            return function(values)
        if name in ("currentDate", "yesterdayDate"):
            day = self.today if name == "currentDate" else self.today - dt.timedelta(days=1)
            return day.isoformat()
        raise TemplateError(f"function {name!r} is not reproduced")

    def logic(self, name: str, args: Sequence[Any], dot: Any, final: Any) -> Any:
        operands: list[Any] = list(args)
        if final is not _NO_FINAL:
            operands.append(Literal(final))
        if not operands:
            raise TemplateError(f"{name} needs arguments")
        value: Any = None
        for operand in operands:
            value = self.arg(operand, dot)  # evaluated one at a time: and/or stop at the first that decides
            if truth(value) != (name == "and"):
                return value
        return value


_NO_FINAL = object()


def _fields(value: Any, names: Sequence[str]) -> Any:
    for name in names:
        if isinstance(value, GoStruct):
            if name not in value.fields:
                raise TemplateError(f"can't evaluate field {name} in type {value.type_name}")
            value = value.fields[name]
        elif isinstance(value, dict):
            value = value.get(name)
        else:
            raise TemplateError(f"can't evaluate field {name} of {type(value).__name__}")
    return value


def _range_items(value: Any) -> list[tuple[Any, Any]]:
    if value is None:
        return []
    if isinstance(value, GoList):
        return list(enumerate(value.items))
    if isinstance(value, list | tuple):
        return list(enumerate(value))
    if isinstance(value, dict):
        return [(k, value[k]) for k in sorted(value, key=lambda k: str(k).encode())]
    if isinstance(value, int) and not isinstance(value, bool):
        return [(i, i) for i in range(value)]
    raise TemplateError(f"range can't iterate over {type(value).__name__}")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "nil"
    raise TemplateError(f"can't compare {type(value).__name__}")


def _eq(values: list[Any]) -> bool:
    if len(values) < 2:
        raise TemplateError("missing argument for comparison")
    first, *rest = values
    for other in rest:
        if _kind(first) != _kind(other):
            if "nil" in (_kind(first), _kind(other)):
                continue
            raise TemplateError("incompatible types for comparison")
        if first == other:
            return True
    return False


def _ordered(values: list[Any]) -> tuple[Any, Any]:
    if len(values) != 2:
        raise TemplateError("comparison needs two arguments")
    a, b = values
    if _kind(a) != _kind(b) or _kind(a) in ("bool", "nil"):
        raise TemplateError("invalid types for ordering")
    if isinstance(a, str):
        return a.encode(), b.encode()
    return a, b


def _len(values: list[Any]) -> int:
    (value,) = _exactly(values, 1)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list | tuple | dict):
        return len(value)
    if isinstance(value, GoList):
        return len(value.items)
    raise TemplateError(f"len of {type(value).__name__}")


def _slice(values: list[Any]) -> Any:
    if not values or len(values) > 4:
        raise TemplateError("slice needs 1 to 4 arguments")
    item, *bounds = values
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
        raise TemplateError("slice bounds must be integers")
    sequence: Any = item.items if isinstance(item, GoList) else item
    if isinstance(sequence, str):
        if len(bounds) == 3:
            raise TemplateError("cannot 3-index slice a string")
        encoded = sequence.encode()
        end = bounds[1] if len(bounds) > 1 else len(encoded)
        start = bounds[0] if bounds else 0
        if not 0 <= start <= end <= len(encoded):
            raise TemplateError("slice index out of range")
        try:
            return encoded[start:end].decode()
        except UnicodeDecodeError as exc:
            raise TemplateError("slice cuts a multi-byte character") from exc
    if not isinstance(sequence, list | tuple):
        raise TemplateError(f"can't slice {type(item).__name__}")
    end = bounds[1] if len(bounds) > 1 else len(sequence)
    start = bounds[0] if bounds else 0
    if not 0 <= start <= end <= len(sequence):
        raise TemplateError("slice index out of range")
    return list(sequence[start:end])


def _index(values: list[Any]) -> Any:
    if not values:
        raise TemplateError("index needs an argument")
    item, *keys = values
    for key in keys:
        if isinstance(item, GoList):
            item = item.items
        if isinstance(item, list | tuple) and isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(item):
                raise TemplateError(f"index out of range: {key}")
            item = item[key]
        elif isinstance(item, dict):
            item = item.get(key)
        else:
            raise TemplateError(f"can't index {type(item).__name__}")
    return item


def _print(values: list[Any]) -> str:
    parts: list[str] = []
    for i, value in enumerate(values):
        if i and not isinstance(value, str) and not isinstance(values[i - 1], str):
            parts.append(" ")
        parts.append(go_print(value))
    return "".join(parts)


def _printf(values: list[Any]) -> str:
    if not values or not isinstance(values[0], str):
        raise TemplateError("printf needs a format string")
    fmt, args = values[0], list(values[1:])
    out: list[str] = []
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        verb = fmt[i + 1 : i + 2]
        i += 2
        if verb == "%":
            out.append("%")
        elif verb in ("s", "v", "d") and args:
            arg = args.pop(0)
            if verb == "d" and (not isinstance(arg, int) or isinstance(arg, bool)):
                raise TemplateError("%d of a non-integer")
            out.append(go_print(arg))
        elif verb == "q" and args and isinstance(args[0], str):
            out.append(go_json(args.pop(0)))
        else:
            raise TemplateError(f"printf verb %{verb} is not reproduced")
    if args:
        raise TemplateError("printf has extra arguments")
    return "".join(out)


def _exactly(values: list[Any], n: int) -> list[Any]:
    if len(values) != n:
        raise TemplateError(f"wrong number of args: want {n}, got {len(values)}")
    return values


def _json(values: list[Any]) -> str:
    (value,) = _exactly(values, 1)
    if isinstance(value, GoMap) and value.is_nil:
        return "null"
    return go_json(value)


_FUNCTIONS: dict[str, Callable[[list[Any]], Any]] = {
    "eq": _eq,
    "ne": lambda v: not _eq(_exactly(v, 2)),
    "lt": lambda v: (lambda a, b: a < b)(*_ordered(v)),
    "le": lambda v: (lambda a, b: a <= b)(*_ordered(v)),
    "gt": lambda v: (lambda a, b: a > b)(*_ordered(v)),
    "ge": lambda v: (lambda a, b: a >= b)(*_ordered(v)),
    "not": lambda v: not truth(_exactly(v, 1)[0]),
    "len": _len,
    "slice": _slice,
    "index": _index,
    "print": _print,
    "printf": _printf,
    "println": lambda v: " ".join(go_print(x) for x in v) + "\n",
    "json": _json,
}
