"""Typed accessors for JSON request fields; each error names the field, what was expected and what came.

JSON types are named as a client would write them (string, integer, object, ...), not as Python types.
"""

from __future__ import annotations

from typing import Any

from gateway.domain import OutputLimit
from gateway.errors import InvalidField

_JSON_TYPE_NAMES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}


def json_type_name(value: object) -> str:
    """The JSON name of a decoded value's type."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _wrong_type(path: str, expected: str, value: object) -> InvalidField:
    return InvalidField(path, f"field '{path}' must be {expected}, got {json_type_name(value)}")


def required_model(body: dict[str, Any], *, alias: str | None = None) -> str:
    """The ``model`` field: a non-empty string (``alias`` is a deprecated name for it, e.g. Ollama's ``name``)."""
    value = body.get("model")
    if value is None and alias is not None:
        value = body.get(alias)
    if value is None or value == "":
        raise InvalidField("model", "field 'model' is required: name the model to use")
    if not isinstance(value, str):
        raise _wrong_type("model", "a string", value)
    return value


def optional_str(body: dict[str, Any], key: str, path: str | None = None) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _wrong_type(path or key, "a string", value)


def optional_bool(body: dict[str, Any], key: str, path: str | None = None) -> bool | None:
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise _wrong_type(path or key, "a boolean (true or false)", value)


def optional_int(body: dict[str, Any], key: str, path: str | None = None) -> int | None:
    """An integer; a float with no fractional part (``4096.0``) is accepted, as Go and C++ servers accept it."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise _wrong_type(path or key, "an integer", value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    raise _wrong_type(path or key, "an integer", value)


def optional_object(body: dict[str, Any], key: str, path: str | None = None) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise _wrong_type(path or key, "an object", value)


def optional_list(body: dict[str, Any], key: str, path: str | None = None) -> list[Any] | None:
    value = body.get(key)
    if value is None or isinstance(value, list):
        return value
    raise _wrong_type(path or key, "an array", value)


def string_or_list(body: dict[str, Any], key: str) -> str | list[Any] | None:
    value = body.get(key)
    if value is None or isinstance(value, str | list):
        return value
    raise _wrong_type(key, "a string or an array", value)


def objects(items: list[Any], path: str) -> tuple[dict[str, Any], ...]:
    """Every element of an array must be an object (messages, tools)."""
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise _wrong_type(f"{path}[{index}]", "an object", item)
    return tuple(items)


def messages(body: dict[str, Any], *, required: bool, content_may_be_list: bool) -> tuple[dict[str, Any], ...]:
    """A chat ``messages`` array: objects with a string ``role`` and a string (or part list) ``content``."""
    items = optional_list(body, "messages")
    if items is None:
        if required:
            raise InvalidField("messages", "field 'messages' is required: send the conversation as an array")
        return ()
    checked = objects(items, "messages")
    for index, message in enumerate(checked):
        optional_str(message, "role", f"messages[{index}].role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if content_may_be_list and isinstance(content, list):
            continue
        expected = "a string or an array of content parts" if content_may_be_list else "a string"
        raise _wrong_type(f"messages[{index}].content", expected, content)
    return checked


def _at(body: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    target: Any = body
    for key in path[:-1]:
        target = target.get(key) if isinstance(target, dict) else None
    if not isinstance(target, dict) or path[-1] not in target:
        return False, None
    return True, target[path[-1]]


def output_limit(
    body: dict[str, Any], candidates: tuple[tuple[str, ...], ...], write_to: tuple[str, ...]
) -> OutputLimit:
    """Read every output-limit field the body carries (``candidates``, as paths); see ``OutputLimit``.

    A ``null`` value counts as absent, as every backend reads it; a negative one means "no limit"."""
    present: list[tuple[str, ...]] = []
    values: list[int] = []
    for path in candidates:
        found, _ = _at(body, path)
        if not found:
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        value = optional_int(parent, path[-1], ".".join(path))
        if value is None:
            continue
        present.append(path)
        values.append(value)
    unlimited = not values or any(value < 0 for value in values)
    return OutputLimit(None if unlimited else max(values), tuple(present), write_to)


def sequences(body: dict[str, Any], keys: tuple[str, ...], *, strict: bool = True) -> int:
    """How many completions the body asks for (OpenAI ``n``, llama-server ``n_cmpl``); 1 when not given. Not
    ``strict`` (a route several kinds of backend serve: Ollama ignores ``n``, the others answer their own 400), a
    value that is no positive integer counts as 1 and is left to the backend."""
    asked = 1
    for key in keys:
        if not strict:
            value = body.get(key)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                asked = max(asked, value)
            continue
        value = optional_int(body, key)
        if value is None:
            continue
        if value < 1:
            raise InvalidField(key, f"field '{key}' must be at least 1, got {value}")
        asked = max(asked, value)
    return asked


def _token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prompt_batch(value: Any) -> tuple[Any, ...] | None:
    """The prompts of a field llama-server reads as a batch (``tokenize_input_prompts``), None when it holds one.

    An array with no token id in it is a batch, one prompt (and one task, one sequence) per element: strings, token
    id lists, mixed lists, ``{"prompt_string": ...}`` objects. A string, an array of token ids, or a mix of strings
    and ids is one prompt. Never raises: what an element is, is for the backend (or ``check_batch``) to say."""
    if isinstance(value, list) and not any(_token_id(item) for item in value):
        return tuple(value)
    return None


def _one_prompt(value: Any) -> bool:
    """A string, token ids (possibly mixed with strings), or a multimodal object with a string prompt."""
    if isinstance(value, str):
        return True
    if isinstance(value, list):
        return all(_token_id(item) or isinstance(item, str) for item in value) and (
            not value or any(_token_id(item) for item in value))
    return isinstance(value, dict) and isinstance(value.get("prompt_string"), str)


def check_batch(value: Any, key: str) -> tuple[Any, ...]:
    """The prompts of ``value`` as llama-server accepts them (one, or a batch), else the 400 it gives, naming the
    element: a batch must not be empty, and each element must be one prompt (``_one_prompt``)."""
    batch = prompt_batch(value)
    if batch is None:
        if not _one_prompt(value):
            raise InvalidField(key, f"field '{key}' must be a string, an array of token ids (or of strings and "
                                    f"token ids), or an array of such prompts; got {json_type_name(value)}")
        return (value,)
    if not batch:
        raise InvalidField(key, f"field '{key}' must not be empty: send at least one prompt")
    for index, item in enumerate(batch):
        if not _one_prompt(item):
            path = f"{key}[{index}]"
            raise InvalidField(path, f"field '{path}' must be a string, a list of token ids, a list of strings and "
                                     f"token ids, or an object with a string prompt_string; got {json_type_name(item)}")
    return batch
