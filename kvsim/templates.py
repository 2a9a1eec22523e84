"""Chat templates: messages -> the prompt text a model's server tokenizes.

Text-only renderings of the templates Ollama's library ships for each family (their Go source, as ``/api/show``
returns it, is in ``go_templates.py``; no tools, no images beyond a placeholder), applied after Ollama's
``collate``: system messages are joined with a blank line into ``.System``, and consecutive messages of one role
(except ``tool``) are merged with a blank line. ``phi3`` and ``none`` are legacy templates, which Ollama runs once
per (system, prompt, response) turn and cuts after the last ``.Response``. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    images: int = 0


def collate(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    """Ollama ``template.collate``: (joined system text, messages with same-role runs merged)."""
    system: list[str] = []
    out: list[Message] = []
    for msg in messages:
        if msg.role == "system":
            system.append(msg.content)
        if out and out[-1].role == msg.role and msg.role != "tool":
            last = out[-1]
            out[-1] = Message(last.role, last.content + "\n\n" + msg.content, last.images + msg.images)
        else:
            out.append(msg)
    return "\n\n".join(system), out


def _llama3(system: str, msgs: list[Message]) -> str:
    parts = [f"<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"] if system else []
    assistant_header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    for i, m in enumerate(msgs):
        last = i == len(msgs) - 1
        if m.role == "user":
            parts.append(f"<|start_header_id|>user<|end_header_id|>\n\n{m.content}<|eot_id|>")
            parts.append(assistant_header if last else "")
        elif m.role == "assistant":
            parts.append(assistant_header + m.content + ("" if last else "<|eot_id|>"))
        elif m.role == "tool":
            parts.append(f"<|start_header_id|>ipython<|end_header_id|>\n\n{m.content}<|eot_id|>")
            parts.append(assistant_header if last else "")
    return "".join(parts)


def _qwen2(system: str, msgs: list[Message]) -> str:
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    for i, m in enumerate(msgs):
        last = i == len(msgs) - 1
        if m.role == "user":
            parts.append(f"<|im_start|>user\n{m.content}<|im_end|>\n")
        elif m.role == "assistant":
            parts.append(f"<|im_start|>assistant\n{m.content}" + ("" if last else "<|im_end|>\n"))
        elif m.role == "tool":
            parts.append(f"<|im_start|>user\n<tool_response>\n{m.content}\n</tool_response><|im_end|>\n")
        if last and m.role != "assistant":
            parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _gemma3(system: str, msgs: list[Message]) -> str:
    parts: list[str] = []
    for i, m in enumerate(msgs):
        last = i == len(msgs) - 1
        if m.role in ("user", "system"):
            parts.append(f"<start_of_turn>user\n{m.content}<end_of_turn>\n")
            parts.append("<start_of_turn>model\n" if last else "")
        elif m.role == "assistant":
            parts.append(f"<start_of_turn>model\n{m.content}" + ("" if last else "<end_of_turn>\n"))
    return "".join(parts)


def _mistral(system: str, msgs: list[Message]) -> str:
    parts: list[str] = []
    for i, m in enumerate(msgs):
        last = i == len(msgs) - 1
        if m.role == "user":
            prefix = f"{system}\n\n" if system and last else ""
            parts.append(f"[INST]{prefix}{m.content}[/INST]")
        elif m.role == "assistant" and m.content:
            parts.append(m.content + ("" if last else "</s>"))
        elif m.role == "tool":
            parts.append(f'[TOOL_RESULTS]{{"content": {m.content}}}[/TOOL_RESULTS]')
    return "".join(parts)


def _legacy_turns(msgs: list[Message]) -> list[tuple[str, str, str]]:
    """Ollama's loop for templates without ``.Messages``: (system, prompt, response) per turn, in order. A system
    message or a user message after a reply closes the turn; the last turn is left open for the response."""
    turns: list[tuple[str, str, str]] = []
    system = prompt = response = ""
    for m in msgs:
        if m.role == "system":
            if prompt or response:
                turns.append((system, prompt, response))
                prompt = response = ""
            system = m.content
        elif m.role == "user":
            if response:
                turns.append((system, prompt, response))
                system = response = ""
            prompt = m.content
        elif m.role == "assistant":
            response = m.content
    turns.append((system, prompt, response))
    return turns


def _phi3(system: str, msgs: list[Message]) -> str:
    parts: list[str] = []
    turns = _legacy_turns(msgs)
    for i, (sys_text, prompt, response) in enumerate(turns):
        if sys_text:
            parts.append(f"<|system|>\n{sys_text}<|end|>\n")
        if prompt:
            parts.append(f"<|user|>\n{prompt}<|end|>\n")
        parts.append("<|assistant|>\n" + response + ("" if i == len(turns) - 1 else "<|end|>\n"))
    return "".join(parts)


def _chatml(system: str, msgs: list[Message]) -> str:
    """llama.cpp's built-in fallback when a GGUF carries no chat template."""
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    parts += [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in msgs if m.role != "system"]
    return "".join(parts) + "<|im_start|>assistant\n"


def _plain(system: str, msgs: list[Message]) -> str:
    """The default ``{{ .Prompt }}`` template (plus the ``{{ .Response }}`` Ollama appends), turn after turn."""
    return "".join(prompt + response for _, prompt, response in _legacy_turns(msgs))


_RENDERERS: dict[str, Callable[[str, list[Message]], str]] = {
    "llama3": _llama3,
    "qwen2": _qwen2,
    "gemma3": _gemma3,
    "mistral": _mistral,
    "phi3": _phi3,
    "chatml": _chatml,
    "none": _plain,
}


def render(template: str, messages: Sequence[Message]) -> str:
    system, collated = collate(messages)
    return _RENDERERS[template](system, collated)
