"""The adversarial matrix of issue 9 point 2: cells, request bodies, bursts, and what counts as a failure.

A cell is one (route, stream, output limit, model) combination. A burst is a handful of concurrent requests of
that cell, sized to overrun the backend's KV pool when sent straight at it. Each reply is classified:

- ``ok``: a completed response in the route's format (a final ``done``, ``[DONE]``, ``response.completed``,
  ``message_stop`` or ``stop: true``);
- ``refused``: a 4xx or 503 in the route's error format that is not a context/memory error (through kvgate: its
  clear refusal; straight at Ollama: e.g. 404 for a made-up model name);
- ``failed``: anything else, in particular llama-server's 500 "Context size has been exceeded.", its 400
  ``exceed_context_size_error``, Ollama's out-of-memory or "input length exceeds the context length" errors, an
  error event inside a stream, a stream that ends without its final event, or a timeout. A prompt that Ollama
  truncated silently (a 200 with a short ``prompt_eval_count``) is counted by the caller from the simulator's
  ``truncated_prompts`` counter, which sees every cut.

One exception (issue 22: an estimate never refuses): a prompt kvgate could only estimate (``X-Kvgate-Counter``
says ``estimate``: infill's FIM tokens) is forwarded for the backend to judge, so its 400 ``exceed_context_size_error``
for a prompt that alone is past the context is the backend's clear refusal in the route's own format, counted as
``refused``; a 500, or a context error on a counted prompt, is still a failure.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MATRICES: list[str] = []
"""Every matrix a test rendered in this run, for the summary at the end of the run."""

OLLAMA_ROUTES = (
    "/api/chat",
    "/api/generate",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
)
LLAMA_ROUTES = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/completion",
    "/completions",
    "/infill",
)
STREAMS = (False, True)
LIMITS = ("none", "limit", "negative", "small+n_predict")
MODELS = ("none", "served", "made-up")
MADE_UP_MODEL = "no-such-model:13b"

CONTEXT_ERRORS = (
    "context size has been exceeded",
    "exceed_context_size_error",
    "exceeds the available context size",
    "out of memory",
    "input length exceeds the context length",
    "prompt is longer than the context length",
    "failed to allocate",
)
_WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "table",
    "window",
    "music",
    "paper",
    "light",
    "garden",
    "silver",
    "ocean",
    "forest",
    "market",
    "number",
    "summer",
    "winter",
    "simple",
    "yellow",
    "letter",
    "mountain",
    "orange",
    "yesterday",
    "bridge",
    "candle",
    "doctor",
    "engine",
    "family",
    "guitar",
    "harbor",
    "island",
    "jacket",
    "kitchen",
    "ladder",
    "mirror",
    "needle",
    "office",
    "pencil",
    "rabbit",
    "saddle",
    "tunnel",
    "valley",
    "wagon",
)


@dataclass(frozen=True)
class Cell:
    route: str
    stream: bool
    limit: str
    model: str

    def label(self) -> str:
        return f"{self.route} {'stream' if self.stream else 'plain '} {self.limit}"


@dataclass(frozen=True)
class Target:
    """One backend layout under test and the burst that overruns it."""

    title: str
    kind: str  # "llama-server" | "ollama"
    served: str  # the model name the backend serves
    prompt_words: tuple[int, ...]  # one request per entry: the length of its prompt, in words
    limit_tokens: int  # the "limit" value of the output-limit axis
    big_n_predict: int = 3000  # the n_predict beside max_tokens 16


@dataclass
class Tally:
    ok: int = 0
    refused: int = 0
    failed: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, outcome: str, reason: str = "") -> None:
        if outcome == "ok":
            self.ok += 1
        elif outcome == "refused":
            self.refused += 1
            if reason:
                self.reasons.append("refused: " + reason)
        else:
            self.failed += 1
            self.reasons.append(reason)


def full_cross_product(routes: Sequence[str]) -> list[Cell]:
    return [Cell(*values) for values in itertools.product(routes, STREAMS, LIMITS, MODELS)]


def covering_cells(routes: Sequence[str], shift: int = 0) -> list[Cell]:
    """One cell per route; the other axes cycle with coprime strides, so every value of every axis appears at
    least once (the longest axis, routes, sets the count) and the shift gives a second layout other pairs."""
    return [
        Cell(route, STREAMS[(i + shift) % 2], LIMITS[(i + shift) % 4], MODELS[(i + 2 * shift) % 3])
        for i, route in enumerate(routes)
    ]


def prompt_text(index: int, words: int) -> str:
    chosen = (_WORDS[(index * 11 + j * 7) % len(_WORDS)] for j in range(words))
    return f"Request {index}: summarise this. " + " ".join(chosen)


def _limit_fields(target: Target, cell: Cell, field_name: str) -> dict[str, Any]:
    if cell.limit == "limit":
        return {field_name: target.limit_tokens}
    if cell.limit == "negative":
        return {field_name: -1}
    if cell.limit == "small+n_predict":
        return {field_name: 16, "n_predict": target.big_n_predict}
    return {}


def body_for(target: Target, cell: Cell, index: int, words: int) -> dict[str, Any]:
    text = prompt_text(index, words)
    body: dict[str, Any] = {"stream": cell.stream}
    if cell.model == "served":
        body["model"] = target.served
    elif cell.model == "made-up":
        body["model"] = MADE_UP_MODEL
    route = cell.route
    if route in ("/api/chat", "/api/generate"):
        body.update(_ollama_fields(target, cell, text))
        return body
    if target.kind == "llama-server":
        body["ignore_eos"] = True  # the tiny model's random weights must not stop early (dropped by /v1/messages)
    if route in ("/v1/chat/completions", "/chat/completions"):
        body["messages"] = [{"role": "user", "content": text}]
        body.update(_limit_fields(target, cell, "max_tokens"))
    elif route == "/v1/responses":
        body["input"] = text
        body.update(_limit_fields(target, cell, "max_output_tokens"))
    elif route == "/v1/messages":
        body["messages"] = [{"role": "user", "content": text}]
        body.update(_limit_fields(target, cell, "max_tokens"))
    elif route == "/infill":
        body.update(input_prefix=f"def f{index}():\n    # {text}\n", input_suffix="\n    return x\n")
        body.update(_native_limit(target, cell))
    else:  # /v1/completions, /completion, /completions
        body["prompt"] = text
        body.update(
            _limit_fields(target, cell, "max_tokens") if route == "/v1/completions" else _native_limit(target, cell)
        )
    if cell.stream and route in ("/v1/chat/completions", "/chat/completions"):
        body["stream_options"] = {"include_usage": True}
    return body


def _native_limit(target: Target, cell: Cell) -> dict[str, Any]:
    if cell.limit == "small+n_predict":
        return {"max_tokens": 16, "n_predict": target.big_n_predict}
    return _limit_fields(target, cell, "n_predict")


def _ollama_fields(target: Target, cell: Cell, text: str) -> dict[str, Any]:
    fields: dict[str, Any] = (
        {"messages": [{"role": "user", "content": text}]} if cell.route == "/api/chat" else {"prompt": text}
    )
    if cell.limit == "limit":
        fields["options"] = {"num_predict": target.limit_tokens}
    elif cell.limit == "negative":
        fields["options"] = {"num_predict": -1}
    elif cell.limit == "small+n_predict":  # fields Ollama ignores beside its own small limit
        fields.update(options={"num_predict": 16}, num_predict=target.big_n_predict, n_predict=target.big_n_predict)
    return fields


def bodies_for(target: Target, cell: Cell) -> list[dict[str, Any]]:
    return [body_for(target, cell, i, words) for i, words in enumerate(target.prompt_words)]


# --- classification ----------------------------------------------------------------------------------------


def _is_context_error(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in CONTEXT_ERRORS)


def _error_message(route: str, payload: Any) -> str | None:
    """The message of an error body in the route's own format, None when the body is not one."""
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if route.startswith("/api/"):
        return error if isinstance(error, str) and error else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return str(error["message"])
    return None


def _events(raw: bytes) -> list[tuple[str, str]]:
    """SSE events as (event name, data); comments and pings are skipped."""
    out: list[tuple[str, str]] = []
    for block in raw.replace(b"\r\n", b"\n").decode("utf-8", "replace").split("\n\n"):
        name, data = "", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if data or name:
            out.append((name, "\n".join(data)))
    return out


def _json(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


EMBEDDING_ROUTES = ("/embedding", "/embeddings", "/v1/embeddings")
RERANK_ROUTES = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")


def _completed_body(route: str, payload: Any) -> bool:
    if route in EMBEDDING_ROUTES:  # native: one result per input; OpenAI: "data"
        items = payload if isinstance(payload, list) else payload.get("data") if isinstance(payload, dict) else None
        return isinstance(items, list) and bool(items)
    if route in RERANK_ROUTES:  # Jina: "results"; TEI: a list
        return isinstance(payload, list) or (isinstance(payload, dict) and isinstance(payload.get("results"), list))
    if isinstance(payload, list) and route in ("/completion", "/completions"):  # a batch: one result per prompt
        return bool(payload) and all(_completed_body(route, item) for item in payload)
    if not isinstance(payload, dict) or payload.get("error") is not None:  # a Responses object has "error": null
        return False
    if route.startswith("/api/"):
        return payload.get("done") is True
    if route == "/v1/responses":
        return payload.get("status") == "completed"
    if route == "/v1/messages":
        return payload.get("type") == "message"
    if route in ("/completion", "/completions", "/infill"):
        return payload.get("stop") is True
    return bool(payload.get("choices"))


def _classify_stream(route: str, raw: bytes) -> tuple[str, str]:
    if route.startswith("/api/"):
        lines = [_json(line) for line in raw.splitlines() if line.strip()]
        for line in lines:
            if isinstance(line, dict) and "error" in line:
                return "failed", "stream error: " + str(line["error"])[:80]
        done = bool(lines) and isinstance(lines[-1], dict) and lines[-1].get("done") is True
        return ("ok", "") if done else ("failed", "stream ended without done")
    events = _events(raw)
    for name, data in events:
        payload = _json(data) if data != "[DONE]" else None
        if name == "error" or (isinstance(payload, dict) and payload.get("error") is not None):
            return "failed", "stream error event: " + data[:80]
    names = {name for name, _ in events}
    last = events[-1][1] if events else ""
    if route == "/v1/responses":
        ok = "response.completed" in names or '"response.completed"' in raw.decode("utf-8", "replace")
    elif route == "/v1/messages":
        ok = "message_stop" in names or '"message_stop"' in raw.decode("utf-8", "replace")
    elif route in ("/completion", "/completions", "/infill"):
        final = _json(last)
        ok = isinstance(final, dict) and final.get("stop") is True
    else:
        ok = last == "[DONE]"
    return ("ok", "") if ok else ("failed", f"stream ended without its final event ({len(events)} events)")


def classify(route: str, stream: bool, status: int, raw: bytes, counter: str = "") -> tuple[str, str]:
    """(outcome, reason) of one reply (``counter``: kvgate's X-Kvgate-Counter, if any); see the module docstring."""
    text = raw.decode("utf-8", "replace")
    if status == 400 and counter.endswith("estimate") and "exceed_context_size_error" in text:
        return "refused", f"{status} the backend's own, for a prompt kvgate could only estimate: {text[:100]}"
    if status == 200:
        if stream and (route.startswith("/api/") or not text.lstrip().startswith("{")):
            return _classify_stream(route, raw)
        payload = _json(raw)
        if _completed_body(route, payload):
            return "ok", ""
        return "failed", f"200 without a completed body: {text[:80]}"
    if _is_context_error(text):
        return "failed", f"{status} {text[:200]}"
    message = _error_message(route, _json(raw))
    if (400 <= status < 500 or status == 503) and message is not None:
        return "refused", f"{status} {message[:100]}"
    return "failed", f"{status} {text[:200]}"


# --- bursts --------------------------------------------------------------------------------------------------


async def post_one(
    http: aiohttp.ClientSession, url: str, route: str, body: dict[str, Any], timeout_s: float
) -> tuple[str, str]:
    try:
        async with asyncio.timeout(timeout_s), http.post(url + route, json=body) as response:
            raw = await response.read()
            outcome, reason = classify(route, bool(body.get("stream")), response.status, raw,
                                       response.headers.get("X-Kvgate-Counter", ""))
            return outcome, reason
    except TimeoutError:
        return "failed", f"no complete reply within {timeout_s:.0f} s"
    except aiohttp.ClientError as exc:
        return "failed", f"transport: {exc!r}"[:120]


async def burst(
    http: aiohttp.ClientSession, url: str, route: str, bodies: Iterable[dict[str, Any]], timeout_s: float
) -> Tally:
    tally = Tally()
    for outcome, reason in await asyncio.gather(*(post_one(http, url, route, b, timeout_s) for b in bodies)):
        tally.add(outcome, reason)
    return tally


async def sim_stat(http: aiohttp.ClientSession, sim_url: str, name: str) -> int:
    async with http.get(sim_url + "/sim/stats") as response:
        value: int = (await response.json())[name]
        return value


# --- the printed matrix --------------------------------------------------------------------------------------


def render_matrix(title: str, results: dict[Cell, tuple[Tally, Tally]]) -> str:
    """Rows: route x stream x limit; columns: the model axis; cells: direct failures / through-kvgate failures
    (and, through kvgate, the refusals as ``rN``)."""
    rows: dict[str, dict[str, str]] = {}
    for cell, (direct, gated) in results.items():
        refused = f" r{gated.refused}" if gated.refused else ""
        rows.setdefault(cell.label(), {})[cell.model] = f"{direct.failed}/{gated.failed}{refused}"
    width = max((len(label) for label in rows), default=10)
    lines = [
        f"== {title}: direct failures / through-kvgate failures (rN: clear refusals by kvgate)",
        " " * width + "".join(f" | {m:>12}" for m in MODELS),
    ]
    lines += [label.ljust(width) + "".join(f" | {row.get(m, '-'):>12}" for m in MODELS) for label, row in rows.items()]
    direct_cells = sum(1 for d, _ in results.values() if d.failed)
    gated_cells = sum(1 for _, g in results.values() if g.failed)
    lines.append(f"cells: {len(results)}; with direct failures: {direct_cells}; with kvgate failures: {gated_cells}")
    return "\n".join(lines)


def failure_reasons(results: dict[Cell, tuple[Tally, Tally]]) -> str:
    lines = []
    for cell, (_, gated) in results.items():
        if gated.failed:
            first = next(r for r in gated.reasons if not r.startswith("refused"))
            lines.append(f"  {cell.label()} model={cell.model}: {gated.failed} x {first}")
    return "\n".join(lines)


# --- issue 22 point 5: shapes the backend runs as several sequences -------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One request shape of the batch matrix: a route and a body builder (``index`` varies the text per request);
    ``streams`` says whether the route streams (completions) or not (embeddings, reranking)."""

    name: str
    route: str
    streams: bool = True

    def label(self, stream: bool) -> str:
        return f"{self.name:<24} {self.route:<16} {'stream' if stream else 'plain '}"


BATCH_SHAPES = (
    Shape("batch of strings", "/completion"),
    Shape("batch of strings", "/v1/completions"),
    Shape("batch of token-id lists", "/v1/completions"),
    Shape("batch of token-id lists", "/completions"),
    Shape("batch mixed", "/completion"),
    Shape("batch of one", "/v1/completions"),
    Shape("batch of one", "/completion"),
    Shape("batch past the slots", "/completion"),
    Shape("batch past the slots", "/v1/completions"),
    Shape("empty batch", "/completion"),
    Shape("empty batch", "/v1/completions"),
    Shape("nested garbage", "/completion"),
    Shape("nested garbage", "/v1/completions"),
    Shape("embedding of one", "/v1/embeddings", streams=False),
    Shape("embedding of one", "/embedding", streams=False),
    Shape("embedding of many", "/v1/embeddings", streams=False),
    Shape("embedding of many", "/embeddings", streams=False),
    Shape("rerank of many", "/rerank", streams=False),
    Shape("rerank of many", "/v1/rerank", streams=False),
)
REFUSED_SHAPES = ("empty batch", "nested garbage")
"""Shapes llama-server itself refuses with a 400 (kvgate too, on its own routes): they prove no overrun."""


def _ids(index: int, count: int) -> list[int]:
    return [300 + (index * 37 + i * 11) % 20000 for i in range(count)]


def shape_body(shape: Shape, stream: bool, index: int, *, prompt_words: int, output_tokens: int,
               input_words: int) -> dict[str, Any]:
    """One request of the shape's burst: prompts of about ``prompt_words`` words (a batch's first prompt longer
    than the others, so that the tasks the server runs at once can overrun the pool while the longest ones that
    kvgate reserves still fit), answers of ``output_tokens`` that never stop early (``ignore_eos``); an embedding's
    or a rerank's first input of ``input_words`` (no output: their own tokens must overrun the pool)."""
    long_text, short_text = prompt_text(index, prompt_words), prompt_text(index + 50, max(2, prompt_words // 4))
    body: dict[str, Any] = {"ignore_eos": True, "stream": stream} if shape.streams else {}
    long_input, short_inputs = prompt_text(index, input_words), [prompt_text(index + k, 3) for k in (1, 2)]
    if shape.route in EMBEDDING_ROUTES:
        inputs: Any = long_input if shape.name == "embedding of one" else [long_input, *short_inputs]
        return {"input" if shape.route == "/v1/embeddings" else "content": inputs}
    if shape.route in RERANK_ROUTES:
        return {"query": f"which of these is about item {index}", "documents": [long_input, *short_inputs]}
    prompts: Any = {
        "batch of strings": [long_text, short_text, short_text],
        "batch of token-id lists": [_ids(index, prompt_words), _ids(index + 1, prompt_words // 4),
                                    _ids(index + 2, prompt_words // 4)],
        "batch mixed": [_ids(index, prompt_words), short_text, [short_text, 5, 6]],
        "batch of one": [long_text],
        "batch past the slots": [long_text] + [prompt_text(index + k, 2) for k in range(7)],
        "empty batch": [],
        "nested garbage": [["not", "a", "prompt"], [[1, 2]], {"no": "prompt_string"}],
    }[shape.name]
    limit = "max_tokens" if shape.route == "/v1/completions" else "n_predict"
    return {**body, "prompt": prompts, limit: output_tokens}


def render_shapes(title: str, results: dict[tuple[Shape, bool], tuple[Tally, Tally]]) -> str:
    """Rows: shape x route x stream; columns: straight at the backend and through kvgate (ok / refused / failed)."""
    lines = [f"== {title}: ok/refused/failed of each burst, straight at the backend | through kvgate"]
    for (shape, stream), (direct, gated) in results.items():
        lines.append(f"{shape.label(stream)} | {direct.ok:>2}/{direct.refused:>2}/{direct.failed:>2} | "
                     f"{gated.ok:>2}/{gated.refused:>2}/{gated.failed:>2}")
    direct_cells = sum(1 for d, _ in results.values() if d.failed)
    gated_cells = sum(1 for _, g in results.values() if g.failed)
    lines.append(f"cells: {len(results)}; with direct failures: {direct_cells}; with kvgate failures: {gated_cells}")
    return "\n".join(lines)
