"""A deterministic corpus of varied chat requests (OpenAI shape) for token-count parity tests and benchmarks.

Covers system prompts or none, short and long conversations, single tool calls with tool results, content given as
lists of text parts, unicode (CJK, RTL, emoji with joiners, combining marks), code with tabs and CRLF, whitespace at
the edges (which the Llama 3 template trims), and long documents.
"""

from __future__ import annotations

import json
import random
from typing import Any

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Could you summarise the attached report in three bullet points?",
    "I'm not sure that's right; let's double-check the numbers first.",
    "Version 2.10.3 fixed 1,024 bugs and introduced 17 regressions.",
    "It's 3:45 PM in Zürich, and the café's crème brûlée costs CHF 12.50.",
    "東京の天気は晴れです。明日は雨が降るかもしれません。",
    "Привет! Как дела? Всё хорошо, спасибо.",
    "مرحبا بالعالم، هذا اختبار للنص العربي.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Emoji test: \U0001f469\u200d\U0001f4bb\U0001f680\u2728 \u2014 family "
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 and flags \U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5.",
    "Combining marks: e\u0301, a\u0308, n\u0303; zero\u200bwidth\u200cjoiners.",
    "\u00dcn\u00efc\u00f6d\u00e9 w\u00efth d\u00efacritics everywhere, \ufb01 ligatures and "
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48 letters.",
    "They'll say we've done what you'd expect, but I'd disagree.",
    "Numbers: 3.14159, 2718281828, -42, 1e-9, 0x1F, 100%.",
    "    Indented line with trailing spaces    ",
    '<html><body><p class="x">Hello &amp; goodbye</p></body></html>',
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id;",
    "Tokens like <|eot_id|> inside user text are still special for the server.",
]

CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "const x = await fetch(`/api/${id}`);\r\nif (!x.ok) throw new Error(x.statusText);\r\n",
    "```python\nimport json\nprint(json.dumps({'a': [1, 2, 3]}, indent=2))\n```",
    '#include <stdio.h>\n\nint main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n',
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Full-text search over the internal documentation (returns up to 10 hits).",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
                "required": ["query"],
            },
        },
    },
]


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(SENTENCES) for _ in range(sentences))


def _text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:
        return rng.choice(CODE)
    if kind < 0.25:
        return "\n\n".join(_paragraph(rng, rng.randint(1, 3)) for _ in range(rng.randint(2, 4)))
    if kind < 0.3:
        return "  " + _paragraph(rng, 2) + " \n"
    return _paragraph(rng, rng.randint(1, 6))


def _document(rng: random.Random, paragraphs: int) -> str:
    parts = []
    for i in range(paragraphs):
        parts.append(f"## Section {i + 1}\n\n" + _paragraph(rng, rng.randint(4, 10)))
        if i % 5 == 4:
            parts.append(rng.choice(CODE))
    return "Please review this document:\n\n" + "\n\n".join(parts)


def _tool_exchange(rng: random.Random, index: int) -> list[dict[str, Any]]:
    if rng.random() < 0.5:
        name, args = "get_weather", {"city": rng.choice(["Paris", "東京", "São Paulo"]), "days": rng.randint(1, 7)}
        result: Any = {"temperature": rng.randint(-5, 35), "conditions": "sunny", "unit": "celsius"}
    else:
        name, args = "search_docs", {"query": rng.choice(SENTENCES)[:40], "limit": 3}
        result = [{"title": "KV cache sizing", "score": 12}, {"title": "Slots", "score": 7}]
    call_id = f"call_{index}"
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)},
    ]


def _chat(rng: random.Random, index: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": _text(rng)})
    use_tools = rng.random() < 0.3
    turns = rng.choice([1, 1, 2, 3, 5, 8, 15, 25])
    for turn in range(turns):
        if index % 10 == 9 and turn == 0:
            messages.append({"role": "user", "content": _document(rng, rng.randint(15, 60))})
        elif rng.random() < 0.1:
            messages.append({"role": "user", "content": [{"type": "text", "text": _text(rng)}] * 2})
        else:
            messages.append({"role": "user", "content": _text(rng)})
        if use_tools and rng.random() < 0.5:
            messages.extend(_tool_exchange(rng, turn))
        if turn < turns - 1 or rng.random() < 0.15:
            messages.append({"role": "assistant", "content": _text(rng)})
    body: dict[str, Any] = {"messages": messages}
    if use_tools:
        body["tools"] = TOOLS[: rng.randint(1, 2)]
    return body


def chat_corpus(n: int = 60, seed: int = 20240726) -> list[dict[str, Any]]:
    """`n` chat request bodies (messages, optional tools), the same on every run."""
    rng = random.Random(seed)
    return [_chat(rng, i) for i in range(n)]
