"""The settings reference: every setting of :class:`gateway.config.settings.Settings`, its environment variable, default
and description, as a Markdown table rendered from the models themselves (so a new setting is in it at once).

    python -m gateway.config.reference                    print the table
    python -m gateway.config.reference --write README.md  replace the table between the README's markers

tests/config/test_reference.py fails while the README's table differs from what this renders.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ByteSize, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config.fitting import FittingOverrideSettings
from gateway.config.settings import Settings

START = "<!-- settings-reference:start (python -m gateway.config.reference --write README.md) -->"
END = "<!-- settings-reference:end -->"
PREFIX = "KVGATE_"
MAX_DEFAULT_CHARS = 40


def _model_of(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """("", Model) for a nested model, (".NAME", Model) for a table of them, ("[]", Model) for a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "", annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return ".NAME", args[1]
    if origin is tuple and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return "[]", args[0]
    return None


def _default(field: FieldInfo) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, ByteSize):
        return value.human_readable(decimal=False)
    if isinstance(value, enum.Enum):
        value = value.value
    text = json.dumps(value, default=str) if isinstance(value, tuple | list | dict | bool) else str(value)
    return text if len(text) <= MAX_DEFAULT_CHARS else text[:MAX_DEFAULT_CHARS - 3] + "..."


def _rows(model: type[BaseModel], path: str, env: str | None) -> Iterator[tuple[str, str, str, str]]:
    """(setting, environment variable, default, description) for each leaf setting under ``path``; ``env`` is the
    variable prefix, None inside a list (its items are set as one JSON value)."""
    for name, field in model.model_fields.items():
        dotted = f"{path}{name}"
        variable = f"{env}{name.upper()}" if env is not None else None
        nested = _model_of(field.annotation)
        if nested is not None and nested[1] is not FittingOverrideSettings:
            suffix, inner = nested
            if suffix == "[]":
                yield dotted, f"`{variable}` (a JSON list)" if variable else "", "", field.description or ""
                yield from _rows(inner, f"{dotted}[].", None)
            else:
                inner_env = (f"{variable}__" + ("<NAME>__" if suffix else "")) if variable else None
                yield from _rows(inner, f"{dotted}{suffix}.", inner_env)
            continue
        description = field.description or ""
        default = _default(field)
        if nested is not None:  # a model's or a tenant's fitting: overrides of [fitting]
            description, default = "overrides any of the fitting.* settings, for this one", "unset"
        shown = f"`{variable}`" if variable else "(in the list's JSON)"
        yield dotted, shown, default, description


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The Markdown table of every setting."""
    lines = ["| setting | environment variable | default | what it does |", "|---|---|---|---|"]
    for setting, variable, default, description in _rows(Settings, "", PREFIX):
        shown_default = f"`{_cell(default)}`" if default else ""
        lines.append(f"| `{setting}` | {variable} | {shown_default} | {_cell(description)} |")
    return "\n".join(lines) + "\n"


def replace_section(text: str) -> str:
    """``text`` (the README) with the table between its markers rendered anew."""
    head, found, rest = text.partition(START)
    if not found or END not in rest:
        raise ValueError(f"the markers {START!r} and {END!r} are not in the file")
    return f"{head}{START}\n{render()}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.config.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="README", help="replace the table between the markers")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(render())
        return 0
    args.write.write_text(replace_section(args.write.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
