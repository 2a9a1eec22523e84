"""The overhead benchmark's parts that can be wrong without a run: reading wrk's report, nginx's configuration, and
the side-by-side table of every hop (issue 26, point 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hops import BARE, BASELINE, DIRECT, KVGATE, LITELLM, NGINX, SHARED, nginx_config
from bench.overhead import Result, Row, _paired, _turned, hops_table, render
from bench.wrk_runs import Wrk, parse_wrk

WRK_REPORT = """Running 2s test @ http://127.0.0.1:1/api/chat
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    53.18ms   10.11ms 101.00ms   70.00%
  Latency Distribution
     50%  512.00us
     75%    1.20ms
     90%    2.00ms
     99%    1.01s
  2214 requests in 2.00s, 1.21MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:   1107.00
Transfer/sec:    619.01KB
"""


def test_a_wrk_report_gives_the_median_the_rate_and_every_failure() -> None:
    result = parse_wrk(WRK_REPORT)
    assert (result.p50_ms, result.requests_per_s, result.failed) == (0.512, 1107.0, 7 + 3 + 2)
    assert parse_wrk(WRK_REPORT.replace("512.00us", "1.50s")).p50_ms == 1500.0
    with pytest.raises(ValueError, match="not a wrk --latency report"):
        parse_wrk("Usage: wrk <options> <url>")


def test_a_body_that_would_need_escaping_in_lua_is_refused() -> None:
    with pytest.raises(ValueError, match="escaping"):
        Wrk("/usr/bin/wrk", b"{\"content\": \"it's\"}")


def test_nginx_runs_as_a_keep_alive_unbuffered_proxy_on_loopback(tmp_path: Path) -> None:
    conf = nginx_config(tmp_path, 8081, 9091)
    for line in ("listen 127.0.0.1:8081;", "server 127.0.0.1:9091; keepalive 128;", "proxy_buffering off;",
                 'proxy_set_header Connection "";', "proxy_http_version 1.1;", f"pid {tmp_path}/nginx.pid;"):
        assert line in conf, line
    assert "daemon off;" in conf and "worker_processes 1;" in conf


def _result(median_ms: float, rate: float) -> Result:
    return Result([median_ms / 1000], 1.0, round(rate))


def _row(name: str, direct: tuple[float, float], **through: tuple[float, float, float]) -> Row:
    return Row(name, _result(*direct), {label: (_result(ms, rate), ratio) for label, (ms, rate, ratio) in
                                        through.items()})


def test_every_hop_is_one_row_of_the_table_and_a_missing_one_says_why() -> None:
    labels = {"kvgate": KVGATE, "bare": BARE, "nginx": NGINX, "shared": SHARED}
    rows = [
        _row("small chat, c=1", (0.3, 3000), kvgate=(1.2, 800, 0.27), bare=(0.5, 2000, 0.66)),
        _row("small chat, c=64", (17.0, 3500), kvgate=(110.0, 500, 0.14), bare=(30.0, 1800, 0.5)),
        _row("500-chunk stream, c=1", (4.0, 90000), kvgate=(8.0, 50000, 0.55), bare=(6.0, 70000, 0.8)),
        _row("500-chunk stream, c=64", (280.0, 98000), kvgate=(270.0, 100000, 1.0), bare=(280.0, 98000, 1.0)),
        _row("small chat, c=1 (wrk)", (0.1, 9000), kvgate=(1.1, 900, 0.1), bare=(0.4, 2500, 0.28),
             nginx=(0.2, 5000, 0.55), shared=(1.9, 500, 0.05)),
        _row("small chat, c=64 (wrk)", (2.0, 9400), kvgate=(100.0, 600, 0.06), bare=(25.0, 2200, 0.23),
             nginx=(8.0, 6800, 0.72), shared=(120.0, 540, 0.057)),
    ]
    for row in rows:
        row.through = {labels[k]: v for k, v in row.through.items()}
    table = hops_table(rows, {LITELLM: "not installed"})
    print("\n" + table)
    lines = table.splitlines()
    assert "small chats: wrk" in lines[0]
    kvgate = next(line for line in lines if line.startswith(KVGATE + " "))
    assert kvgate.split()[1:5] == ["+1.000", "600", "0.06", "0.09"]  # added, req/s, of direct, of nginx (600/6800)
    assert next(line for line in lines if line.startswith(DIRECT)).split()[1:3] == ["0.000", "9400"]
    assert f"{LITELLM:<28} not measured: not installed" in lines
    report = render(rows, {LITELLM: "not installed"})
    assert "requests/s at c=64 >= 10% of nginx's: 8.8% -> FAIL" in report
    assert "with the shared ledger >= 0.8x the requests/s of one unshared kvgate at c=64: 0.90x -> PASS" in report
    assert "added median latency at c=1 <= 0.3 ms: 1.000 ms -> FAIL (wrk)" in report


def test_each_hop_goes_first_in_turn_and_the_baseline_is_compared_round_by_round() -> None:
    hops = [DIRECT, KVGATE, BARE, BASELINE]
    firsts = [_turned(hops, index)[0] for index in range(8)]
    assert firsts == hops * 2 and all(sorted(_turned(hops, i)) == sorted(hops) for i in range(8))
    # round by round: 1.00, 1.01, 0.98 -> 1.00; without the rounds, the rates of the median rounds: 700 / 690
    rounds = {KVGATE: [_result(1.0, rate) for rate in (700, 1000, 500)],
              BASELINE: [_result(1.0, rate) for rate in (700, 990, 510)]}
    row = Row("small chat, c=1", _result(0.3, 3000), {KVGATE: (_result(1.0, 700), 0.2),
                                                      BASELINE: (_result(1.0, 690), 0.2)}, rounds)
    assert _paired(row) == pytest.approx(1.0)
    assert _paired(Row("x", _result(0.3, 3000), row.through)) == pytest.approx(700 / 690)
