"""What llama-server reads from each generation route's body: the prompt tokens, ``n_predict`` and ``ignore_eos``.

Facts from llama-server.md section 1 and the server's converters (``server-chat.cpp``, ``server-common.cpp``):

- ``n_predict`` has the aliases ``max_completion_tokens`` and ``max_tokens``, checked in that order, so an explicit
  ``n_predict`` wins over ``max_tokens``; each must lie in -1..INT32_MAX (else 400); unset means the server's
  ``-n``, -1 (unlimited: generation runs until EOS or the slot's context fills).
- ``/v1/responses``: the body is copied, ``input`` (a string or a list of items) and ``instructions`` become
  ``messages``, ``max_output_tokens`` replaces ``max_tokens``; every other field (``n_predict``, ``ignore_eos``)
  passes through.
- ``/v1/messages`` (Anthropic): a new body is built; ``max_tokens`` defaults to 4096 and only ``temperature``,
  ``top_p``, ``top_k``, ``stream`` and ``chat_template_kwargs`` pass through, so ``n_predict`` and ``ignore_eos``
  are dropped.
- ``/infill`` needs the vocabulary's FIM prefix/suffix/middle tokens, else 501.
- ``prompt`` (``tokenize_input_prompts``, checked against the real server): an array with no token id in it is a
  batch, one task per element; a string, an array of token ids, or a mix of strings and ids (BOS only when the
  mix starts with a string) is one prompt; ``{"prompt_string": ...}`` is one prompt too. An empty batch is 400
  ``"prompt" must not be empty``; any other element is 400 ``"prompt" elements must be ...``. The embedding routes
  read ``input`` (else ``content``) the same way (empty: ``"input" must not be empty``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.failures import SimError
from kvsim.llama_server.llama_engine import LlamaServerEngine
from kvsim.templates import Message, render

INT32_MAX = 2**31 - 1
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
_FIM_TEXTS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


ELEMENTS_ERROR = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
                  "or a list of mixed strings & tokens.")


@dataclass(frozen=True)
class Generation:
    """One generation request: its prompts (one task each; one prompt unless the body sent a batch)."""

    prompts: tuple[list[int], ...]
    n_predict: int
    ignore_eos: bool
    stream: bool

    @property
    def prompt(self) -> list[int]:
        return self.prompts[0]


def n_predict_of(body: dict[str, Any]) -> int:
    for key in ("n_predict", "max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value <= INT32_MAX:
            raise SimError(400, f"Field '{key}': Value must be between -1 and {INT32_MAX}")
        return value
    return -1


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _generation(engine: LlamaServerEngine, body: dict[str, Any], *prompts: list[int]) -> Generation:
    return Generation(prompts, n_predict_of(body), body.get("ignore_eos") is True, body.get("stream") is True)


def chat_prompt(engine: LlamaServerEngine, body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if messages is None:
        raise SimError(400, "'messages' is required")
    if not isinstance(messages, list):
        raise SimError(400, "Expected 'messages' to be an array")
    parsed = [Message(str(m.get("role", "")), _text(m.get("content"))) for m in messages if isinstance(m, dict)]
    return engine.tokenizer.encode(render(engine.template, parsed))


def chat(engine: LlamaServerEngine, body: dict[str, Any]) -> Generation:
    return _generation(engine, body, chat_prompt(engine, body))


def responses(engine: LlamaServerEngine, body: dict[str, Any]) -> Generation:
    """``server_chat_convert_responses_to_chatcmpl``."""
    source = body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(source, str):
        messages.append({"role": "user", "content": source})
    elif isinstance(source, list):
        for item in source:
            if not isinstance(item, dict):
                raise SimError(400, "Cannot determine type of 'item'")
            role = item.get("role", "assistant" if item.get("type") == "message" else "user")
            messages.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"))})
    else:
        raise SimError(400, "'input' must be a string or array of objects")
    converted = {k: v for k, v in body.items() if k not in ("input", "instructions")}
    converted["messages"] = messages
    if "max_output_tokens" in converted:
        converted["max_tokens"] = converted.pop("max_output_tokens")
    return chat(engine, converted)


def anthropic(engine: LlamaServerEngine, body: dict[str, Any]) -> Generation:
    """``server_chat_convert_anthropic_to_oai``: only a few fields survive."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            messages.append({"role": str(m.get("role", "")), "content": _text(m.get("content"))})
    converted: dict[str, Any] = {
        "messages": messages,
        "max_tokens": body.get("max_tokens", ANTHROPIC_DEFAULT_MAX_TOKENS),
    }
    if "stream" in body:
        converted["stream"] = body["stream"]
    return chat(engine, converted)


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _subprompt(engine: LlamaServerEngine, raw: Any) -> list[int]:
    """``tokenize_input_subprompt``: a string, token ids, a mix (``tokenize_mixed``), or a prompt_string object."""
    if isinstance(raw, dict) and isinstance(raw.get("prompt_string"), str):
        raw = raw["prompt_string"]
    if isinstance(raw, str):
        return engine.tokenizer.encode(raw)
    if not isinstance(raw, list) or not all(_token_id(t) or isinstance(t, str) for t in raw):
        raise SimError(400, ELEMENTS_ERROR)
    if raw and not any(_token_id(t) for t in raw):
        raise SimError(400, ELEMENTS_ERROR)  # strings only: a batch, not one prompt
    ids: list[int] = []
    for position, part in enumerate(raw):
        if _token_id(part):
            ids.append(part)
            continue
        encoded = engine.tokenizer.encode(part)
        bos = engine.spec.bos_id if engine.spec.add_bos else None
        ids.extend(encoded[1:] if position > 0 and encoded[:1] == [bos] else encoded)  # BOS only when first
    return ids


def prompts_of(engine: LlamaServerEngine, raw: Any, *, field: str = "prompt") -> tuple[list[int], ...]:
    """``tokenize_input_prompts``: one prompt, or a batch of them (an array without a token id in it)."""
    if isinstance(raw, list) and not any(_token_id(t) for t in raw):
        if not raw:
            raise SimError(400, f'"{field}" must not be empty')
        return tuple(_subprompt(engine, item) for item in raw)
    return (_subprompt(engine, raw),)


def completion(engine: LlamaServerEngine, body: dict[str, Any]) -> Generation:
    """Native ``/completion`` and ``/completions``: ``prompt`` is one prompt or a batch (``prompts_of``)."""
    return _generation(engine, body, *prompts_of(engine, body.get("prompt", "")))


def oai_completion(engine: LlamaServerEngine, body: dict[str, Any]) -> Generation:
    """``/v1/completions`` (``oaicompat_completion_params_parse``)."""
    if "prompt" not in body:
        raise SimError(400, '"prompt" is required')
    for unsupported in ("best_of", "suffix"):
        if unsupported in body:
            raise SimError(400, f"Unsupported param: {unsupported}")
    return _generation(engine, body, *prompts_of(engine, body["prompt"]))


def fim_tokens(engine: LlamaServerEngine) -> tuple[int, int, int] | None:
    """The vocabulary's FIM prefix, suffix and middle tokens, when it has all three."""
    ids: list[int] = []
    bos = engine.spec.bos_id if engine.spec.add_bos else None
    for text in _FIM_TEXTS:
        encoded = engine.tokenizer.encode(text)
        if encoded[:1] == [bos]:
            encoded = encoded[1:]
        if len(encoded) != 1:
            return None
        ids.append(encoded[0])
    return ids[0], ids[1], ids[2]


def infill(engine: LlamaServerEngine, body: dict[str, Any]) -> Generation:
    fim = fim_tokens(engine)
    if fim is None:
        missing = "prefix token is missing. suffix token is missing. middle token is missing. "
        raise SimError(501, f"Infill is not supported by this model: {missing}")
    for field in ("input_prefix", "input_suffix"):
        if not isinstance(body.get(field), str):
            raise SimError(400, f'"{field}" is required')
    encode = engine.tokenizer.encode
    bos = [engine.spec.bos_id] if engine.spec.add_bos else []

    def plain(text: str) -> list[int]:
        ids = encode(text)
        return ids[len(bos) :] if bos and ids[:1] == bos else ids

    prompt = [
        *bos,
        fim[0],
        *plain(body["input_prefix"]),
        fim[1],
        *plain(body["input_suffix"]),
        fim[2],
        *plain(str(body.get("prompt", ""))),
    ]
    return _generation(engine, body, prompt)
