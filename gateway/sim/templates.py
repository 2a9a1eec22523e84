"""Chat templates: messages -> the prompt text a model's server tokenizes.

Text-only renderings of the templates Ollama's library ships for each family (no tools, no images beyond a
placeholder), applied after Ollama's ``collate``: system messages are joined with a blank line into
``.System``, and consecutive messages of one role (except ``tool``) are merged with a blank line. Pure.
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
        if last and m.role in ("user", "tool"):
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
        elif m.role == "assistant":
            parts.append(m.content + ("" if last else "</s>"))
        elif m.role == "tool":
            parts.append(f"[TOOL_RESULTS]{m.content}[/TOOL_RESULTS]")
    return "".join(parts)


def _phi3(system: str, msgs: list[Message]) -> str:
    parts = [f"<|system|>\n{system}<|end|>\n"] if system else []
    for m in msgs:
        if m.role in ("user", "assistant"):
            parts.append(f"<|{m.role}|>\n{m.content}<|end|>\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _chatml(system: str, msgs: list[Message]) -> str:
    """llama.cpp's built-in fallback when a GGUF carries no chat template."""
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    parts += [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in msgs if m.role != "system"]
    return "".join(parts) + "<|im_start|>assistant\n"


def _plain(system: str, msgs: list[Message]) -> str:
    return "\n".join(m.content for m in msgs if m.role != "system")


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
