"""kvgate's Go-template interpreter against the simulator's hand-written renderers: two independent implementations
of each Ollama library template must agree on many random chats (roles in any order, same-role runs, empty
content, unicode, template-looking text)."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from gateway.tokens.gotemplate import OllamaTemplate
from kvsim.ollama.go_templates import GO_TEMPLATES
from kvsim.templates import Message as SimMessage
from kvsim.templates import render as sim_render

TODAY = dt.date(2025, 6, 1)
FAMILIES = ("llama3", "qwen2", "gemma3", "mistral", "phi3", "none")
TEXTS = ("", "hi", "Hello, world.", "  padded  ", "line\nbreak\n\n", "Grüße 東京 😀", "{{ .System }}",
         "<|im_end|>", "a & b < c > d", '"quoted" \\ back', "\t", "word " * 40)
ROLES = ("system", "user", "assistant", "tool")


def random_chat(rng: random.Random) -> list[dict[str, Any]]:
    n = rng.randint(1, 9)
    chat = []
    for i in range(n):
        role = rng.choices(ROLES, weights=(1, 4, 3, 1))[0] if i else rng.choice(("system", "user", "user"))
        chat.append({"role": role, "content": rng.choice(TEXTS) + (str(rng.random()) if rng.random() < 0.3 else "")})
    return chat


@pytest.mark.parametrize("family", FAMILIES)
def test_go_template_renders_like_the_simulator(family: str) -> None:
    template = OllamaTemplate(GO_TEMPLATES[family])
    rng = random.Random(family)
    for _ in range(400):
        chat = random_chat(rng)
        expected = sim_render(family, [SimMessage(m["role"], m["content"]) for m in chat])
        rendered = template.render(chat, today=TODAY)
        assert rendered.text == expected, chat
        assert rendered.exact


def test_consecutive_same_role_messages_merge_and_system_is_kept_in_messages() -> None:
    template = OllamaTemplate("{{ .System }}|{{ range .Messages }}{{ .Role }}={{ .Content }};{{ end }}")
    chat = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
            {"role": "user", "content": "u1"}, {"role": "user", "content": "u2"},
            {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"}]
    assert template.render(chat, today=TODAY).text == "a\n\nb|system=a\n\nb;user=u1\n\nu2;tool=t1;tool=t2;"


def test_default_system_prompt_is_prepended_unless_the_chat_has_one() -> None:
    template = OllamaTemplate(GO_TEMPLATES["qwen2"], system="You are Qwen.")
    plain = template.render([{"role": "user", "content": "hi"}], today=TODAY).text
    assert plain.startswith("<|im_start|>system\nYou are Qwen.<|im_end|>\n")
    own = template.render([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], today=TODAY)
    assert "You are Qwen." not in own.text
