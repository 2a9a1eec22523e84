"""Instructions a small chat costs kvgate, counted by valgrind's callgrind: a figure this noisy machine repeats.

Wall-clock benchmarks here move by 10-40% from minute to minute (the VM's speed drifts), so a change worth 1-5% of a
request's CPU can't be told apart from noise in seconds. Callgrind counts the instructions the kvgate process runs,
which the rest of the machine does not change: the same code and requests give the same count within about 1% (a
round that a pool probe lands in, every ``admission.pool_refresh_s``, counts its ~2M instructions too). Each
kvgate runs under ``valgrind --tool=callgrind`` with counting off while it starts (its imports and tokenizer load are
not a request's cost); each round warms it with ``--warmup`` chats, switches counting on (``callgrind_control -i
on``), sends ``--requests`` small chats one at a time, switches it off and dumps; the dump's total over the chats is
the round's instructions per request. With ``--baseline DIR`` (a checkout of an earlier commit, e.g. from ``git
worktree add``) that checkout's kvgate is counted in the same rounds, order turned each round, and the table gives
the ratio per round and its median.

What it counts is the kvgate process only: user-space instructions, Python's interpreter and the C parts (aiohttp's
parser, orjson, tokenizers) alike; not the kernel's share of a syscall, not time spent waiting. It answers "does this
change make a request cheaper, and by how much", not "how fast is the hop" (``bench.overhead`` measures that).
The requests are small, non-streamed Ollama chats (a stream's coalescing depends on timing, which valgrind's ~50x
slowdown changes).

Run: python -m bench.instructions [--baseline DIR] [--rounds 2] [--requests 300] [--warmup 60]
Needs valgrind (Debian: apt-get install valgrind); without it, it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.hops import _clean_env, _wait_port, free_port, stop_process

SMALL = b'{"model": "bench", "stream": false, "messages": [{"role": "user", "content": "hi"}]}'
START_S = 240.0
"""How long a kvgate under valgrind may take to answer its health check (about 45 s on this 2-core machine)."""
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)


def dump_instructions(dump: bytes) -> int:
    """The total instruction count (event ``Ir``) of one callgrind dump."""
    found = _TOTALS.search(dump)
    if found is None:
        raise ValueError("not a callgrind dump: no 'totals:' line")
    return int(found.group(1))


@dataclass
class Counted:
    """One kvgate under callgrind, and its rounds' instructions per request."""

    label: str
    process: subprocess.Popen[bytes]
    url: str
    out_file: Path
    per_request: list[float]

    def dumps(self) -> list[Path]:
        return sorted(self.out_file.parent.glob(self.out_file.name + ".*"), key=lambda p: int(p.suffix[1:]))


def _chat(url: str) -> None:
    request = urllib.request.Request(url + "/api/chat", data=SMALL, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}")


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=60)


def _round(counted: Counted, warmup: int, requests: int) -> float:
    for _ in range(warmup):
        _chat(counted.url)
    pid = str(counted.process.pid)
    before = len(counted.dumps())
    _control("-i", "on", pid)
    for _ in range(requests):
        _chat(counted.url)
    _control("-i", "off", pid)
    _control("-d", pid)
    deadline = time.monotonic() + 30
    while len(counted.dumps()) == before:  # the dump is written by the process, after the control returns
        if time.monotonic() > deadline:
            raise RuntimeError(f"callgrind wrote no dump for {counted.label}")
        time.sleep(0.1)
    return dump_instructions(counted.dumps()[-1].read_bytes()) / requests


def _start(label: str, checkout: Path, upstream: str, directory: Path, extra_env: Mapping[str, str]) -> Counted:
    port = free_port()
    backend = {"name": "bench", "kind": "ollama", "url": upstream, "parallel": 64}
    env = {**_clean_env(), "KVGATE_SERVER__LOG_LEVEL": "warning", "KVGATE_BACKENDS": json.dumps([backend]),
           "PYTHONPATH": str(checkout), **extra_env}
    out_file = directory / f"{label.replace(' ', '-')}.callgrind"
    process = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}",
         sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Counted(label, process, f"http://127.0.0.1:{port}", out_file, [])


def _healthy(counted: Counted) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            with urllib.request.urlopen(counted.url + "/kvgate/health", timeout=5):
                return
        except OSError:
            if counted.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{counted.label} under valgrind did not come up within {START_S:g} s") from None
            time.sleep(1.0)


def render(rows: list[tuple[str, list[float]]]) -> str:
    """Each kvgate's instructions per request by round and their median; with two, the second being the baseline,
    the per-round ratio (this / baseline) and its median."""
    lines = [f"{'kvgate':<16} {'instructions a small chat, by round':<44} {'median':>12}"]
    for label, values in rows:
        rounds = " ".join(f"{value:,.0f}" for value in values)
        lines.append(f"{label:<16} {rounds:<44} {statistics.median(values):>12,.0f}")
    if len(rows) == 2:
        (_, now), (_, before) = rows
        ratios = [a / b for a, b in zip(now, before, strict=True)]
        lines.append(f"this / baseline by round: {', '.join(f'{r:.3f}' for r in ratios)}; "
                     f"median {statistics.median(ratios):.3f}")
    return "\n".join(lines)


def count(checkouts: list[tuple[str, Path]], *, rounds: int, requests: int, warmup: int,
          extra_env: Mapping[str, str] | None = None) -> list[Counted]:
    """Each (label, checkout)'s kvgate under callgrind in front of one fake upstream, counted in the same rounds
    (order turned each round), with ``extra_env`` added to its environment; everything started is stopped."""
    here = Path(__file__).resolve().parents[1]
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.fake_upstream", str(upstream_port)], env=_clean_env(),
                                cwd=here, stdout=subprocess.DEVNULL)
    counts: list[Counted] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _wait_port(upstream_port)
            url = f"http://127.0.0.1:{upstream_port}"
            counts.extend(_start(label, checkout.resolve(), url, Path(tmp), extra_env or {})
                          for label, checkout in checkouts)
            for counted in counts:
                _healthy(counted)
            for index in range(rounds):
                for counted in counts if index % 2 == 0 else counts[::-1]:
                    counted.per_request.append(_round(counted, warmup, requests))
        finally:
            for counted in counts:
                stop_process(counted.process)
            stop_process(upstream)
    return counts


def missing_tools() -> list[str]:
    return [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--baseline", metavar="DIR", help="also count the kvgate of this checkout, same rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300, help="small chats counted a round")
    parser.add_argument("--warmup", type=int, default=60, help="small chats before each round, not counted")
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"not installed: {', '.join(missing)} (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    checkouts = [("kvgate", Path(__file__).resolve().parents[1])]
    if args.baseline:
        checkouts.append(("kvgate before", Path(args.baseline)))
    counts = count(checkouts, rounds=args.rounds, requests=args.requests, warmup=args.warmup)
    print(render([(counted.label, counted.per_request) for counted in counts]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
