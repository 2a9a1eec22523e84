"""Text-format log values are logfmt values (issue 23, point 5): a value holding a space, ``=``, a quote, a backslash
or a control character is written quoted, with escapes, so no client string can add a field to a line.

The attack: ``GET /v1/x%20200%20tenant=admin`` decodes to the path ``/v1/x 200 tenant=admin``; written bare in the
request's line it reads as a status 200 and a second ``tenant=`` field, before kvgate's own ``tenant=anonymous``.
The same goes for a model name, an X-Request-ID and any extra field. Each line is read back here with a logfmt
tokenizer (a quoted value is one token; backslash escapes inside it), and must carry each field once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import aiohttp
import pytest

from gateway.app import create_app, start_server
from gateway.config.settings import load_settings
from gateway.observability.logs import RequestIdFilter, TextFormatter, logfmt_value
from tests.support.fake_backend import FakeLLM, running

_TOKEN = re.compile(r'(?:[^\s"]*"(?:[^"\\]|\\.)*")+[^\s"]*|\S+')
"""One logfmt token: bare characters, or a key followed by a quoted value (whose escapes may hold a quote)."""
_KEY = re.compile(r'([^\s="]+)=')
"""A field's key: bare characters up to the first ``=`` (a quote before it makes the token a value)."""


def tokens(line: str) -> list[str]:
    """The whitespace-separated tokens of a line, a quoted value being one token whatever it holds."""
    return _TOKEN.findall(line)


def fields(line: str) -> list[str]:
    """The keys of the ``key=value`` tokens of a line, in order (a quoted token is a value, never a key)."""
    return [found.group(1) for token in tokens(line) if (found := _KEY.match(token))]


def unquote(value: str) -> str:
    """A logfmt value back to its text (the inverse of ``logfmt_value`` for the characters it does not escape)."""
    if not value.startswith('"'):
        return value
    return re.sub(r'\\(["\\])', r"\1", value[1:-1])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestIdFilter())
        self.setFormatter(TextFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def text_lines() -> Iterator[_Lines]:
    handler = _Lines()
    logger = logging.getLogger("gateway.proxy")
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


ATTACKS = [  # (case, request target, X-Request-ID, model)
    ("path with %20 and tenant=", "/v1/x%20200%20tenant=admin", None, None),
    ("path with a quote", "/v1/x%22%20tenant=admin%20%22", None, None),
    ("path with a backslash-quote", "/v1/x%5C%22%20tenant=admin", None, None),
    ("request id with spaces", "/api/tags", "id] gateway.proxy: GET /api/tags 200 tenant=admin", None),
    ("request id with a quote", "/api/tags", 'x" tenant="admin', None),
    ("model with tenant=", "/api/chat", None, "m tenant=admin status=200"),
    ("model with a quote", "/api/chat", None, 'm" tenant="admin'),
]


async def test_client_strings_never_add_a_field_to_a_text_line(text_lines: _Lines) -> None:
    rows = []
    async with running(FakeLLM()) as fake:
        app = create_app(load_settings(None, backends=[{"name": "o", "url": fake.url}]), refresh_models=False)
        runner, port = await start_server(app, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http:
                for case, target, request_id, model in ATTACKS:
                    headers = {"X-Request-ID": request_id} if request_id else {}
                    body = None if model is None else {"model": model, "stream": False, "messages": []}
                    before = len(text_lines.lines)
                    async with http.request("GET" if body is None else "POST",
                                            f"http://127.0.0.1:{port}{target}", json=body, headers=headers,
                                            skip_auto_headers=("User-Agent",)) as response:
                        await response.read()
                    line = next(line for line in text_lines.lines[before:] if " gateway.proxy: " in line)
                    keys = fields(line)
                    rows.append((case, keys.count("tenant"), keys.count("status"), line))
        finally:
            await runner.cleanup()
    print("\ncase                          tenant= status=  line")
    for case, tenant, status, line in rows:
        print(f"  {case:<28} {tenant:>6} {status:>7}  {line[24:200]}")
    assert all(tenant == 1 and status == 1 for _, tenant, status, _ in rows), rows
    first = rows[0][3]
    assert '"/v1/x 200 tenant=admin"' in first and "tenant=anonymous" in first


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("plain", "plain"),
        ("llama3.1:8b", "llama3.1:8b"),
        ("", '""'),
        ("a b", '"a b"'),
        ("tenant=admin", '"tenant=admin"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("\x1b[31mred", '"\\x1b[31mred"'),
        ("tab\there", '"tab\\there"'),
        ("sep\u2028x", '"sep\\u2028x"'),
    ],
)
def test_logfmt_values(text: str, written: str) -> None:
    assert logfmt_value(text) == written
    assert len(tokens(f"k={written} next=1")) == 2
    if not re.search(r"[\x00-\x1f\u2028]", text):
        assert unquote(written) == text


def test_the_text_formatter_quotes_extras_and_the_request_id() -> None:
    record = logging.makeLogRecord({"name": "gateway.proxy", "levelno": logging.INFO, "levelname": "INFO",
                                    "msg": "GET %s %d", "args": ("/x", 200), "request_id": "a b=c",
                                    "tenant": "ci", "model": "m tenant=admin", "error": 'it said "no"'})
    line = TextFormatter().format(record)
    assert '["a b=c"]' in line and 'model="m tenant=admin"' in line and 'error="it said \\"no\\""' in line
    assert fields(line) == ["tenant", "model", "error"], line
