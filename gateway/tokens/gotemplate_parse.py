"""Parse the subset of Go text/template that Ollama's chat templates use into a small tree (pure).

    {{ pipeline }}  {{- trim -}}  {{/* comment */}}  if / else if / else / end  range ($i, $m :=)  with
    break / continue  variables ($x := ..., $x = ..., $ root)  fields (.A.B, $x.A, (pipe).A)  literals
    function calls and pipelines (a | f b)

`define`, `template` and `block` raise TemplateError, like anything else this parser does not know: the caller
then counts the chat another way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_SPACE = " \t\r\n"
_KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"})
_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n]+)
    |(?P<decl>:=)
    |(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    |(?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
    |(?P<dot>\.)
    |(?P<string>"(?:[^"\\\n]|\\.)*")
    |(?P<raw>`[^`]*`)
    |(?P<number>[-+]?(?:0[xX][0-9a-fA-F_]+|(?:[0-9][0-9_]*)?\.?[0-9]+(?:[eE][-+]?[0-9]+)?))
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<punct>[|(),=])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")


class TemplateError(ValueError):
    """Raised when a template (or a value it is given) is outside what this interpreter reproduces exactly."""


@dataclass(frozen=True, slots=True)
class Field:
    names: tuple[str, ...]  # () is dot itself


@dataclass(frozen=True, slots=True)
class Variable:
    name: str  # "$" is the root
    names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Ident:
    name: str  # a function


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any


@dataclass(frozen=True, slots=True)
class Chain:
    node: Pipe
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pipe:
    decl: tuple[str, ...]
    assign: bool  # `$x = ...` rather than `$x := ...`
    cmds: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Action:
    pipe: Pipe


@dataclass(frozen=True, slots=True)
class Branch:
    kind: str  # "if", "range" or "with"
    pipe: Pipe
    body: tuple[Any, ...]
    orelse: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True)
class Jump:
    kind: str  # "break" or "continue"


def parse(source: str) -> tuple[Any, ...]:
    """The template's node list; raises TemplateError."""
    items = _lex(source)
    nodes, stop, rest = _parse_list(items, 0)
    if stop is not None:
        raise TemplateError(f"unexpected {{{{{stop[0]}}}}} at top level")
    del rest
    return nodes


def _lex(source: str) -> list[Text | list[tuple[str, Any]]]:
    """Texts and token lists of actions, with trim markers applied and comments dropped."""
    items: list[Text | list[tuple[str, Any]]] = []
    pos, trim_next = 0, False
    while True:
        start = source.find("{{", pos)
        text = source[pos:] if start < 0 else source[pos:start]
        if trim_next:
            text = text.lstrip(_SPACE)
        if start < 0:
            if text:
                items.append(Text(text))
            return items
        inner = start + 2
        if source[inner : inner + 1] == "-" and source[inner + 1 : inner + 2] in tuple(_SPACE):
            text = text.rstrip(_SPACE)
            inner += 2
        if text:
            items.append(Text(text))
        if source.startswith("/*", inner):
            end = source.find("*/", inner)
            if end < 0:
                raise TemplateError("unclosed comment")
            pos, trim_next = _close(source, end + 2)
            continue
        tokens, pos, trim_next = _lex_action(source, inner)
        items.append(tokens)


def _close(source: str, pos: int) -> tuple[int, bool]:
    if source.startswith("}}", pos):
        return pos + 2, False
    if source[pos : pos + 1] in tuple(_SPACE) and source.startswith("-}}", pos + 1):
        return pos + 4, True
    raise TemplateError("comment ends before closing delimiter")


def _lex_action(source: str, pos: int) -> tuple[list[tuple[str, Any]], int, bool]:
    tokens: list[tuple[str, Any]] = []
    while True:
        if source.startswith("}}", pos):
            return tokens, pos + 2, False
        match = _TOKEN.match(source, pos)
        if match is None:
            raise TemplateError(f"unexpected {source[pos:pos + 10]!r} in action")
        kind = match.lastgroup or ""
        if kind == "space":
            end = match.end()
            if source.startswith("-}}", end):
                return tokens, end + 3, True
            pos = end
            continue
        tokens.append(_token(kind, match.group()))
        pos = match.end()
        if source.startswith(".", pos) and kind == "punct" and match.group() == ")":
            chained = _TOKEN.match(source, pos)
            if chained is None or chained.lastgroup != "field":
                raise TemplateError("bad field chain after ')'")
            tokens.append(("chain", tuple(chained.group()[1:].split("."))))
            pos = chained.end()


def _token(kind: str, text: str) -> tuple[str, Any]:
    if kind == "var":
        name, *names = text.split(".")
        return "var", Variable(name, tuple(names))
    if kind == "field":
        return "field", Field(tuple(text[1:].split(".")))
    if kind == "dot":
        return "field", Field(())
    if kind == "string":
        return "lit", Literal(_unquote(text[1:-1]))
    if kind == "raw":
        return "lit", Literal(text[1:-1])
    if kind == "number":
        return "lit", Literal(_number(text))
    if kind == "ident":
        if text in _KEYWORDS:
            return "kw", text
        if text in ("true", "false"):
            return "lit", Literal(text == "true")
        if text == "nil":
            return "lit", Literal(None)
        return "ident", Ident(text)
    return kind, text


def _unquote(body: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] in "xuU" and len(code) > 1:
            return chr(int(code[1:], 16))
        if code in _ESCAPES:
            return _ESCAPES[code]
        raise TemplateError(f"unknown escape \\{code} in string")

    return _ESCAPE.sub(one, body)


def _number(text: str) -> int | float:
    clean = text.replace("_", "")
    try:
        return int(clean, 0)
    except ValueError:
        try:
            return float(clean)
        except ValueError as exc:
            raise TemplateError(f"bad number {text!r}") from exc


Items = list[Text | list[tuple[str, Any]]]


def _parse_list(items: Items, index: int) -> tuple[tuple[Any, ...], list[tuple[str, Any]] | None, int]:
    """Nodes up to an `else` or `end` action (returned as the stop tokens, with the index after it)."""
    nodes: list[Any] = []
    while index < len(items):
        item = items[index]
        index += 1
        if isinstance(item, Text):
            nodes.append(item)
            continue
        if not item:
            raise TemplateError("missing value for command")
        head = item[0]
        if head == ("kw", "end") or head == ("kw", "else"):
            return tuple(nodes), item, index
        if head[0] == "kw":
            node, index = _parse_keyword(str(head[1]), item[1:], items, index)
            nodes.append(node)
        else:
            nodes.append(Action(_parse_pipe(item, allow_decl=True)))
    return tuple(nodes), None, index


def _parse_keyword(word: str, tokens: list[tuple[str, Any]], items: Items, index: int) -> tuple[Any, int]:
    if word in ("break", "continue"):
        if tokens:
            raise TemplateError(f"unexpected tokens after {word}")
        return Jump(word), index
    if word not in ("if", "range", "with"):
        raise TemplateError(f"{{{{{word}}}}} is not supported")
    pipe = _parse_pipe(tokens, allow_decl=True)
    body, stop, index = _parse_list(items, index)
    if stop is None:
        raise TemplateError(f"unclosed {{{{{word}}}}}")
    orelse: tuple[Any, ...] | None = None
    if stop[0] == ("kw", "else"):
        if len(stop) > 1 and stop[1] in (("kw", "if"), ("kw", "with")):
            nested, index = _parse_keyword(str(stop[1][1]), stop[2:], items, index)
            return Branch(word, pipe, body, (nested,)), index  # `else if` shares the outer `end`
        if len(stop) > 1:
            raise TemplateError("unexpected tokens after else")
        orelse, stop, index = _parse_list(items, index)
        if stop is None or stop[0] != ("kw", "end") or len(stop) > 1:
            raise TemplateError(f"expected end after else of {word}")
    elif len(stop) > 1:
        raise TemplateError("unexpected tokens after end")
    return Branch(word, pipe, body, orelse), index


def _parse_pipe(tokens: list[tuple[str, Any]], *, allow_decl: bool) -> Pipe:
    decl, assign, rest = _parse_decl(tokens) if allow_decl else ((), False, tokens)
    cmds: list[tuple[Any, ...]] = []
    args: list[Any] = []
    i = 0
    while i < len(rest):
        kind, value = rest[i]
        i += 1
        if (kind, value) == ("punct", "|"):
            if not args:
                raise TemplateError("missing command before |")
            cmds.append(tuple(args))
            args = []
        elif (kind, value) == ("punct", "("):
            depth, j = 1, i
            while j < len(rest) and depth:
                depth += {("punct", "("): 1, ("punct", ")"): -1}.get(rest[j], 0)
                j += 1
            if depth:
                raise TemplateError("unclosed (")
            inner = _parse_pipe(rest[i : j - 1], allow_decl=False)
            i = j
            if i < len(rest) and rest[i][0] == "chain":
                args.append(Chain(inner, rest[i][1]))
                i += 1
            else:
                args.append(inner)
        elif kind in ("field", "var", "lit", "ident"):
            args.append(value)
        else:
            raise TemplateError(f"unexpected {value!r} in pipeline")
    if not args:
        raise TemplateError("missing value for command")
    cmds.append(tuple(args))
    return Pipe(decl, assign, tuple(cmds))


def _parse_decl(tokens: list[tuple[str, Any]]) -> tuple[tuple[str, ...], bool, list[tuple[str, Any]]]:
    """`$x := p`, `$x = p` or `$i, $x := p`: the variables, whether it assigns, and the rest."""

    def plain_var(token: tuple[str, Any]) -> bool:
        return token[0] == "var" and not token[1].names

    if len(tokens) > 2 and plain_var(tokens[0]) and (tokens[1][0] == "decl" or tokens[1] == ("punct", "=")):
        return (tokens[0][1].name,), tokens[1][0] != "decl", tokens[2:]
    two = len(tokens) > 4 and plain_var(tokens[0]) and tokens[1] == ("punct", ",") and plain_var(tokens[2])
    if two and tokens[3][0] == "decl":
        return (tokens[0][1].name, tokens[2][1].name), False, tokens[4:]
    return (), False, tokens
