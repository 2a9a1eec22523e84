"""Issue 24: the re-cut request path (admission/step.py, admission/exchange.py, observability/exchange_log.py,
streaming.py) driven the way clients and attackers send requests, with the path's invariants asserted after every
cell of the matrix.

Targets, each a real kvgate on loopback:
- ``ollama``: the simulated Ollama (``llama3.1:8b``, its GPU read from the exporter, so loads are gated and
  every request claims its model) beside four fake Ollamas that serve one model each, whose name picks the fault:
  ``slow:1b`` (SLOW_S before headers), ``cut:1b`` (a stream that breaks off after one chunk), ``drop:1b`` (the
  connection closed without an answer) and ``hold:1b`` (a stream that never ends: the client leaves);
- ``llama``: the simulated llama-server (one unified pool, any model name): ``/v1/chat/completions``,
  ``/chat/completions``, ``/completion``;
- ``down``: a backend on a port nothing listens on.

Cases: no optional fields, no model, every alias of the output limit (``max_tokens``, ``max_completion_tokens``,
``options.num_predict``, ``n_predict`` on llama-server, a small ``max_tokens`` beside a large ``n_predict``, -1), an
unknown model, hostile bytes (lone surrogates as JSON escapes, invalid UTF-8, NUL, 100 KB names, 200 KB contents,
nesting 5000 deep), bodies that are not JSON or have wrong types, no X-Request-ID, the slow upstream (waited for,
and left by the client before headers), the client leaving mid-stream, the upstream vanishing mid-stream or before
answering, the upstream down; each on ``/v1/chat/completions`` and the native routes, streamed and not; then 50 of
them at once (every case at least once).

After every cell (``check``):
- nothing more is held than before it ran: ledger tokens and sequences, waiting pools, model claims, body bytes (and
  once all cells are over, nothing at all);
- exactly one request log line carries the request's id, the id the reply's ``X-Request-ID`` carries (499 for a
  client that left), and exactly one recent decision when admission decided, none otherwise;
- no 500, the status the cell expects, and an error in the route's own dialect (``{"error": "..."}`` on ``/api``,
  ``{"error": {"message", "type", ...}}`` elsewhere), also as the last event of a stream that broke off;
- every request of a client that left which reached a fake backend was cancelled there.

A lone surrogate is Ollama's U+FFFD (Go's decoder) and llama-server's own 400 (nlohmann::json refuses it).
The matrix is printed (``-s``); the test fails naming every bad cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import astuple, dataclass, field, replace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import ADMITTER, LOADS, METRICS, PROXY, create_app, start_server
from gateway.config.settings import load_settings
from gateway.observability.logs import RequestIdFilter
from kvsim.config import SimConfig
from kvsim.gpu.exporter import EXPORTER_PATH
from tests.kvsim.helpers import running_sim
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.llama_server import free_port
from tests.support.poll import until

MODEL = "llama3.1:8b"
OLLAMA_SIM = SimConfig(models=(MODEL,), num_parallel=2, load_s=0.01, time_scale=50.0,
                       min_response_tokens=2, max_response_tokens=6, gen_tokens_per_s=2000.0)
LLAMA_SIM = SimConfig(mode="llama-server", ctx_size=4096, n_parallel=-1, load_s=0.0, time_scale=50.0,
                      min_response_tokens=2, max_response_tokens=6, gen_tokens_per_s=2000.0)
SLOW_S = 0.6
"""The slow fake's delay before headers; a client that leaves gives up after LEAVE_S."""
LEAVE_S = 0.2
RELEASE_S = 2.0
"""How long a cell's request may take to give back what it held once its reply is read."""
CHAT = [{"role": "user", "content": "hi"}]
NESTED_DEPTH = 5000
OK, CLIENT_ERROR = frozenset({200}), frozenset({400, 413, 422})
UNDECIDED = frozenset({"error", "forwarded"})
"""Log-line decisions of requests admission said nothing about (a bad body, a backend that failed): no recent
decision; every other line has exactly one."""


@dataclass(frozen=True)
class Case:
    """One request shape: ``body`` is the JSON body (bytes: sent as they are); ``expect``: the statuses allowed."""

    name: str
    body: dict[str, Any] | bytes
    expect: frozenset[int]
    leave: str | None = None
    """"early": the client gives up before headers (LEAVE_S); "mid": after the first chunk."""
    send_id: bool = True
    """Send an X-Request-ID; False: kvgate makes one, and the reply's header is the one to find in the log."""


@dataclass(frozen=True)
class Cell:
    target: str
    route: str
    stream: bool | None
    """None: the body says nothing of streaming (the route's default)."""
    case: Case

    def label(self) -> str:
        stream = {None: "default", True: "stream", False: "plain"}[self.stream]
        return f"{self.case.name:<24} {self.target:<6} {self.route:<21} {stream:<7}"


@dataclass
class Result:
    cell: Cell
    status: int | None
    """None: the client left before an answer."""
    released: bool = False
    log_lines: int = 0
    problems: list[str] = field(default_factory=list)

    def row(self) -> str:
        status = "-" if self.status is None else str(self.status)
        flag = "ok" if not self.problems else "BAD: " + "; ".join(self.problems)
        return f"{self.cell.label()} | {status:>4} | {'yes' if self.released else 'NO ':>3} | {self.log_lines} | {flag}"


# --- the cases --------------------------------------------------------------------------------------------------


def _chat_body(route: str, model: str | None, stream: bool | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": "hi"} if route == "/completion" else {"messages": CHAT}
    if model is not None:
        body["model"] = model
    if stream is not None:
        body["stream"] = stream
    return {**body, **extra}


def _nested(depth: int) -> bytes:
    """A JSON value ``depth`` objects deep, deeper than any parser recurses."""
    return b'{"a": ' * depth + b"1" + b"}" * depth


def _limit_aliases(target: str, route: str) -> list[tuple[str, dict[str, Any]]]:
    """Every field the route's dialect reads as the output limit (gateway/dialects: openai.py, ollama.py,
    llamacpp.py)."""
    if route.startswith("/api/"):
        return [("options.num_predict", {"options": {"num_predict": 8}}),
                ("options.num_predict=-1", {"options": {"num_predict": -1}})]
    aliases = [("max_tokens", {"max_tokens": 8}), ("max_completion_tokens", {"max_completion_tokens": 8})]
    if target == "llama":
        aliases += [("n_predict", {"n_predict": 8}), ("max_tokens<n_predict", {"max_tokens": 4, "n_predict": 3000}),
                    ("n_predict=-1", {"n_predict": -1})]
    return aliases


def shape_cases(target: str, route: str, stream: bool) -> list[Case]:
    """The shapes that are the client's own doing, for one route and streaming flag."""
    model = MODEL if target == "ollama" else "any-name"

    def body(**extra: Any) -> dict[str, Any]:
        return _chat_body(route, extra.pop("model", model), stream, **extra)

    unknown = frozenset({404}) if target == "ollama" else OK  # llama-server runs its one model whatever the name
    # a lone surrogate: Ollama (Go) reads it as U+FFFD; llama-server (nlohmann::json) refuses the body, its own 400
    surrogate = OK if target == "ollama" else frozenset({200, 400})
    content_key = "prompt" if route == "/completion" else "messages"

    def content(text: str) -> dict[str, Any]:
        return {content_key: text if route == "/completion" else [{"role": "user", "content": text}]}

    raw = orjson.dumps(body()).decode()
    cases = [Case(f"limit {name}", body(**fields), OK) for name, fields in _limit_aliases(target, route)]
    cases += [
        Case("no model", body(model=None), CLIENT_ERROR if target == "ollama" else OK),
        Case("unknown model", body(model="no-such-model:13b"), unknown),
        Case("model \\udcff escaped", raw.replace(f'"{model}"', f'"{model}\\udcff"').encode(),
             unknown if target == "ollama" else surrogate),
        Case("content \\ud83d + \\xff", raw.encode().replace(b'"hi"', b'"hi \\ud83d \xff"'), surrogate),
        Case("content NUL", body(**content("a\x00b")), OK),
        Case("model 100 KB", body(model="m" * 100_000), unknown | CLIENT_ERROR),
        Case("content 200 KB", body(**content("word " * 40_000)), OK | CLIENT_ERROR),
        Case(f"nested {NESTED_DEPTH} deep", raw.encode()[:-1] + b', "metadata": ' + _nested(NESTED_DEPTH) + b"}",
             CLIENT_ERROR),
        Case("not JSON", b'{"model": "' + model.encode() + b'", "messages": [', CLIENT_ERROR),
        Case("JSON array", b"[1, 2, 3]", CLIENT_ERROR),
        Case("model is a number", body(model=42), CLIENT_ERROR),
        Case("messages a string", body(**{content_key: {"not": "a prompt"}}), CLIENT_ERROR),
        Case("limit a string", body(**_wrong_limit(route)), CLIENT_ERROR),
        Case("stream a string", {**body(), "stream": "yes"}, CLIENT_ERROR),
        Case("no request id", body(), OK, send_id=False),
    ]
    return cases


def _wrong_limit(route: str) -> dict[str, Any]:
    if route.startswith("/api/"):
        return {"options": {"num_predict": "lots"}}
    return {"n_predict": "lots"} if route == "/completion" else {"max_tokens": "lots"}


def fault_cases(route: str, stream: bool) -> list[Case]:
    """The upstream's doing (on the ollama target: the model's name picks the fake) and the client leaving."""
    def body(model: str) -> dict[str, Any]:
        return _chat_body(route, model, stream)

    cases = [
        Case("upstream slow", body("slow:1b"), OK),
        Case("client leaves early", body("slow:1b"), frozenset(), leave="early"),
    ]
    if stream:
        cases += [Case("upstream cut mid-stream", body("cut:1b"), OK),
                  Case("client leaves mid-stream", body("hold:1b"), OK, leave="mid")]
    else:
        cases += [Case("upstream gone, no answer", body("drop:1b"), frozenset({502, 503}))]
    return cases


OLLAMA_ROUTES = ("/v1/chat/completions", "/api/chat")
LLAMA_ROUTES = ("/v1/chat/completions", "/chat/completions", "/completion")


def cells() -> list[Cell]:
    out: list[Cell] = []
    for target, routes in (("ollama", OLLAMA_ROUTES), ("llama", LLAMA_ROUTES)):
        model = MODEL if target == "ollama" else None
        for route in routes:
            out.append(Cell(target, route, None, Case("no optional fields", _chat_body(route, model, None), OK)))
            for stream in (False, True):
                out += [Cell(target, route, stream, case) for case in shape_cases(target, route, stream)]
                if target == "ollama":
                    out += [Cell(target, route, stream, case) for case in fault_cases(route, stream)]
    for route in OLLAMA_ROUTES:
        for stream in (False, True):
            out.append(Cell("down", route, stream, Case("upstream down", _chat_body(route, MODEL, stream),
                                                        frozenset({502}))))
    return out


# --- the targets --------------------------------------------------------------------------------------------------


class RequestLines(logging.Handler):
    """The request log lines (logger gateway.proxy, with a status), by request id."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.addFilter(RequestIdFilter())
        self.by_id: dict[str, list[tuple[int, str]]] = {}
        """request id -> (status, decision) of each line."""

    def emit(self, record: logging.LogRecord) -> None:
        status = getattr(record, "status", None)
        if record.name == "gateway.proxy" and isinstance(status, int):
            line = (status, str(getattr(record, "decision", "-")))
            self.by_id.setdefault(str(getattr(record, "request_id", "-")), []).append(line)


@contextlib.contextmanager
def request_lines() -> Iterator[RequestLines]:
    handler = RequestLines()
    logger = logging.getLogger("gateway.proxy")
    saved = (logger.disabled, logger.level)
    logger.disabled = False  # whatever logging set-up an earlier test made
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.disabled, logger.level = saved


@dataclass(frozen=True)
class Holding:
    reserved_tokens: int = 0
    sequences: int = 0
    waiting_pools: int = 0
    model_claims: int = 0
    body_bytes: int = 0

    def beyond(self, before: Holding) -> list[str]:
        """What is held now that was not ``before`` the cell ran."""
        return [f"{name} {now} (was {then})" for name, now, then in zip(
            self.__dataclass_fields__, astuple(self), astuple(before), strict=True) if now > then]


@dataclass
class Target:
    url: str
    app: web.Application
    fakes: dict[str, FakeLLM] = field(default_factory=dict)
    """The fake backends behind it, by the fault they play."""

    def holding(self) -> Holding:
        """What the app holds now: pool reservations, waiting pools, model claims, body bytes."""
        room = self.app[ADMITTER].room
        room.ledger.check_invariants()
        snapshots = [room.ledger.snapshot(key) for key in room.ledger.keys()]  # noqa: SIM118 - a method, not a dict
        return Holding(sum(s.reserved_tokens for s in snapshots), sum(s.active_sequences for s in snapshots),
                       len(room.waiting_keys()), sum(self.app[LOADS].claimed().values()),
                       self.app[PROXY].bodies.held_bytes)

    def decisions(self, request_id: str) -> int:
        return sum(1 for event in self.app[METRICS].recent_decisions.snapshot() if event["request_id"] == request_id)


@contextlib.asynccontextmanager
async def gateway(backends: list[dict[str, Any]]) -> AsyncIterator[Target]:
    app = create_app(load_settings(None, backends=backends), refresh_models=False)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        yield Target(f"http://127.0.0.1:{port}", app)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def targets() -> AsyncIterator[dict[str, Target]]:
    fakes = {
        "slow": FakeLLM(Script(models=("slow:1b",), first_byte_delay_s=SLOW_S)),
        "cut": FakeLLM(Script(models=("cut:1b",), disconnect_after_chunks=1)),
        "drop": FakeLLM(Script(models=("drop:1b",), drop_connections=10**6)),
        "hold": FakeLLM(Script(models=("hold:1b",), hold_after_chunks=1)),
    }
    async with contextlib.AsyncExitStack() as stack:
        ollama_sim = await stack.enter_async_context(running_sim(OLLAMA_SIM))
        llama_sim = await stack.enter_async_context(running_sim(LLAMA_SIM))
        for fake in fakes.values():
            await stack.enter_async_context(running(fake))
        ollama = [{"name": "sim", "url": ollama_sim, "vram": ollama_sim + EXPORTER_PATH, "vram_refresh_s": 0.01,
                   "parallel": 2}]
        ollama += [{"name": name, "url": fake.url} for name, fake in fakes.items()]
        yield {
            "ollama": replace(await stack.enter_async_context(gateway(ollama)), fakes=fakes),
            "llama": await stack.enter_async_context(gateway([{"name": "cpp", "kind": "llama-server",
                                                               "url": llama_sim}])),
            "down": await stack.enter_async_context(gateway([{"name": "gone",
                                                              "url": f"http://127.0.0.1:{free_port()}"}])),
        }


# --- one cell -----------------------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int | None
    request_id: str | None
    body: bytes


_ids = itertools.count(1)


async def send(http: aiohttp.ClientSession, target: Target, cell: Cell, request_id: str) -> Reply:
    body = cell.case.body if isinstance(cell.case.body, bytes) else orjson.dumps(cell.case.body)
    headers = {"Content-Type": "application/json", **({"X-Request-ID": request_id} if cell.case.send_id else {})}
    if cell.case.leave == "early":
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LEAVE_S), http.post(target.url + cell.route, data=body,
                                                           headers=headers) as response:
                return Reply(response.status, response.headers.get("X-Request-ID"), await response.read())
        return Reply(None, None, b"")
    async with asyncio.timeout(20), http.post(target.url + cell.route, data=body, headers=headers) as response:
        if cell.case.leave == "mid":
            first = await response.content.readline()
            response.close()
            return Reply(response.status, response.headers.get("X-Request-ID"), first)
        return Reply(response.status, response.headers.get("X-Request-ID"), await response.read())


def dialect_problem(route: str, payload: Any) -> str | None:
    """What is wrong with an error payload for the route's dialect (design.md section 3), None when nothing."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if route.startswith("/api/"):
        return None if isinstance(error, str) and error else f"not Ollama's {{'error': str}}: {payload!r:.120}"
    if isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str):
        return None
    return f"not {{'error': {{'message', 'type'}}}}: {payload!r:.120}"


def stream_error(route: str, raw: bytes) -> Any:
    """The last event of a streamed reply, decoded (None when it is not JSON)."""
    lines = [line for line in raw.replace(b"\r\n", b"\n").split(b"\n") if line.strip()]
    if not route.startswith("/api/"):
        lines = [line[5:].strip() for line in lines if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]
    try:
        return orjson.loads(lines[-1]) if lines else None
    except orjson.JSONDecodeError:
        return None


def reply_problems(cell: Cell, reply: Reply, sent_id: str) -> list[str]:
    problems: list[str] = []
    if reply.status is None:
        return problems
    if reply.status == 500:
        problems.append("500")
    if reply.status not in cell.case.expect:
        problems.append(f"status {reply.status}, expected {sorted(cell.case.expect)}: {reply.body[:160]!r}")
    if cell.case.send_id and reply.request_id != sent_id:
        problems.append(f"X-Request-ID {reply.request_id!r}, sent {sent_id!r}")
    if reply.status >= 400:
        try:
            payload = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            payload = reply.body[:120]
        if (problem := dialect_problem(cell.route, payload)) is not None:
            problems.append(problem)
    elif cell.case.name == "upstream cut mid-stream":
        last = stream_error(cell.route, reply.body)
        if (problem := dialect_problem(cell.route, last)) is not None:
            problems.append(f"the stream's last event: {problem}")
    return problems


async def check(target: Target, cell: Cell, reply: Reply, sent_id: str, lines: RequestLines,
                before: Holding) -> Result:
    """The cell's reply and what the path left behind once the request is over, beyond what was held ``before`` it
    ran (nothing, unless an earlier cell leaked: then only this cell's own leak is its)."""
    result = Result(cell, reply.status, problems=reply_problems(cell, reply, sent_id))
    request_id = sent_id if cell.case.send_id else reply.request_id
    if request_id is None:
        result.problems.append("no X-Request-ID on the reply")
        return result
    with contextlib.suppress(AssertionError):  # what is still held is said below
        await until(lambda: not target.holding().beyond(before) and lines.by_id.get(request_id), timeout_s=RELEASE_S)
    held = target.holding().beyond(before)
    result.released = not held
    if held:
        result.problems.append("left held: " + ", ".join(held))
    logged = lines.by_id.get(request_id, [])
    result.log_lines = len(logged)
    if len(logged) != 1:
        result.problems.append(f"{len(logged)} log lines for {request_id!r}: {logged}")
        return result
    (status, decision), = logged
    if cell.case.leave is not None and status != 499:
        result.problems.append(f"a client that left is logged {status}, not 499")
    elif cell.case.leave is None and status != reply.status:
        result.problems.append(f"log line says {status}, reply {reply.status}")
    expected = 0 if decision in UNDECIDED else 1  # observability/decisions.py: admission's decisions only
    if (decisions := target.decisions(request_id)) != expected:
        result.problems.append(f"{decisions} recent decisions for a {decision!r} line, expected {expected}")
    return result


async def run_cell(http: aiohttp.ClientSession, targets: dict[str, Target], cell: Cell) -> tuple[Reply, str]:
    sent_id = f"matrix-{next(_ids)}"
    return await send(http, targets[cell.target], cell, sent_id), sent_id


async def upstream_left_open(by_name: dict[str, Target], sent: list[tuple[Cell, str]]) -> list[str]:
    """A client that left takes its upstream request with it: every request of a client that left which reached a
    fake (kvgate forwards the X-Request-ID) had its handler cancelled there. (One that left while it waited in
    kvgate's queue never reached it.)"""
    problems = []
    for name, leave in (("slow", "early"), ("hold", "mid")):
        fake = by_name["ollama"].fakes[name]
        ids = {sent_id for cell, sent_id in sent if cell.case.leave == leave}

        def reached() -> int:
            return sum(1 for seen in fake.seen if seen.headers.get("X-Request-ID") in ids)  # noqa: B023

        with contextlib.suppress(AssertionError):
            await until(lambda: len(fake.cancelled) >= reached(), timeout_s=5)  # noqa: B023 - awaited here
        if len(fake.cancelled) != reached():
            problems.append(f"{reached()} requests of clients that left reached {name!r}, "
                            f"{len(fake.cancelled)} were cancelled there")
        print(f"clients that left ({leave}): {len(ids)}, reached {name!r}: {reached()}, "
              f"cancelled there: {len(fake.cancelled)}")
    return problems


def left_over(by_name: dict[str, Target]) -> list[str]:
    """Once every cell is over, each gateway holds nothing at all."""
    return [f"{name} still holds {target.holding()}" for name, target in by_name.items()
            if target.holding() != Holding()]


def report(title: str, results: list[Result]) -> list[str]:
    print(f"\n== {title}: case, target, route, stream | status | released? | log lines | problems")
    for result in results:
        print(result.row())
    bad = [result.row() for result in results if result.problems]
    print(f"cells: {len(results)}; bad: {len(bad)}")
    return bad


# --- the tests ----------------------------------------------------------------------------------------------------


@pytest.fixture
async def rig() -> AsyncIterator[tuple[dict[str, Target], RequestLines]]:
    with request_lines() as lines:
        async with targets() as by_name:
            yield by_name, lines


async def _one_by_one(http: aiohttp.ClientSession, by_name: dict[str, Target], lines: RequestLines,
                      chosen: list[Cell]) -> list[tuple[Result, str]]:
    results = []
    for cell in chosen:
        before = by_name[cell.target].holding()
        reply, sent_id = await run_cell(http, by_name, cell)
        results.append((await check(by_name[cell.target], cell, reply, sent_id, lines, before), sent_id))
    return results


async def test_every_cell_leaves_nothing_held_one_log_line_and_errors_in_the_clients_dialect(
    rig: tuple[dict[str, Target], RequestLines],
) -> None:
    by_name, lines = rig
    async with aiohttp.ClientSession() as http:
        chosen = cells()
        results = await _one_by_one(http, by_name, lines, chosen)
    bad = report("one at a time", [result for result, _ in results])
    bad += await upstream_left_open(by_name, [(result.cell, sent_id) for result, sent_id in results])
    bad += left_over(by_name)
    assert not bad, "bad cells:\n" + "\n".join(bad)


def _mixed(count: int) -> list[Cell]:
    """``count`` cells: every case of both targets that answer once (on routes and streaming flags taken in turn),
    the rest drawn across the matrix, in an order that interleaves them."""
    pool = [cell for cell in cells() if cell.target != "down"]
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in pool:
        groups.setdefault((cell.target, cell.case.name), []).append(cell)
    each = [group[i % len(group)] for i, group in enumerate(groups.values())]
    chosen = (each + pool[1::7])[:count]
    return chosen[::2] + chosen[1::2]


async def test_fifty_at_once_leave_nothing_held(rig: tuple[dict[str, Target], RequestLines]) -> None:
    by_name, lines = rig
    chosen = _mixed(50)
    async with aiohttp.ClientSession() as http:
        before = {name: target.holding() for name, target in by_name.items()}
        sent = await asyncio.gather(*(run_cell(http, by_name, cell) for cell in chosen))
        results = [await check(by_name[cell.target], cell, reply, sent_id, lines, before[cell.target])
                   for cell, (reply, sent_id) in zip(chosen, sent, strict=True)]
    bad = report("50 at once", results)
    bad += await upstream_left_open(by_name, [(cell, sent_id) for cell, (_, sent_id) in zip(chosen, sent, strict=True)])
    bad += left_over(by_name)
    assert {cell.case.name for cell in chosen} == {cell.case.name for cell in cells() if cell.target != "down"}
    assert not bad, "bad cells:\n" + "\n".join(bad)

