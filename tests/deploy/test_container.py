"""The image (Dockerfile), proven (issue 27, point 3; before it issue 15, point 4).

Where a container engine can run (podman or docker: ``info`` answers, the base image is here or can be pulled, a
container of it runs), the image is built and started, a simulated Ollama beside it from the same image, and a chat
goes through kvgate in the container on a port published on 127.0.0.1 only; its HEALTHCHECK command and
``kvgate demo`` run in it. Where none can, that test skips saying what each engine answered, and the Dockerfile's own
steps are replayed in a clean virtual environment instead (tests/support/image_replay.py): the COPYs, the RUN's
``pip install .``, then the ENTRYPOINT and CMD with the image's ENV (the host made 127.0.0.1, the port a free one, the
backend a simulator this test starts), the HEALTHCHECK command, a chat and ``kvgate demo``. Both are marked
``container``. The Dockerfile is read strictly (tests/support/dockerfile.py): a new instruction or form fails here
until the replay knows it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path, PurePosixPath

import aiohttp
import ollama
import pytest

from gateway.config.settings import load_settings
from tests.support.container_engine import Engine, find_engine
from tests.support.dockerfile import Copy, DockerfileError, Image, Run, ignore_patterns, ignored, read_image
from tests.support.gateway_server import running_gateway
from tests.support.image_replay import Replayed, replay
from tests.support.llama_server import free_port
from tests.support.poll import until, until_sync

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "Dockerfile"
MODEL = "llama3.1:8b"
SIM_ARGS = ("--models", MODEL, "--load-time", "0.01", "--time-scale", "50")
"""The simulated Ollama behind kvgate: one model, loads in 10 ms, 50 times faster than real time."""
START_TIMEOUT_S = 60.0
DEMO_TIMEOUT_S = 240.0


@functools.cache
def _image() -> Image:
    return read_image(DOCKERFILE)


@functools.cache
def _engine() -> Engine | str:
    return find_engine(_image().base)


def _healthcheck_timeout_s(image: Image) -> float:
    assert image.healthcheck is not None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)s", image.healthcheck.options.get("timeout", "30s"))
    assert found, image.healthcheck.options
    return float(found.group(1))


def _demo_completed(output: str) -> tuple[int, int]:
    """From ``kvgate demo``'s table: (requests, completed) through kvgate (the last column)."""
    rows = {line.rsplit(maxsplit=2)[0]: line.rsplit(maxsplit=2)[-1] for line in output.splitlines()
            if len(line.rsplit(maxsplit=2)) == 3}  # fmt: skip
    assert "requests" in rows and "completed" in rows, output
    return int(rows["requests"]), int(rows["completed"])


def _chat(url: str) -> str:
    """One chat through kvgate at ``url`` with Ollama's own Python client: the reply's text."""
    with ollama.Client(host=url, timeout=60) as client:
        reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert reply.message.role == "assistant"
    return reply.message.content or ""


def test_image_runs_as_a_non_root_user_the_image_adds_with_a_health_check() -> None:
    image = _image()
    added = [command[-1] for step in image.steps if isinstance(step, Run) for command in step.commands
             if command[0] == "useradd"]  # fmt: skip
    assert image.user is not None and image.user.split(":")[0] not in {"root", "0"}
    assert image.user.split(":")[0] in added
    assert image.healthcheck is not None and "/kvgate/health" in image.healthcheck.command[-1]


def test_image_default_config_is_compose_ollama_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CMD's config file is COPY'd into the image; loaded with the image's ENV its backend is compose's "ollama"
    service, and ``docker run -e KVGATE_BACKEND__URL=...`` points it elsewhere. The image's ENV names no backend:
    it would replace the first backend of every other config run in the image (deploy/replicas)."""
    image = _image()
    path = Path(image.cmd[image.cmd.index("--config") + 1])
    (copied,) = [step for step in image.steps if isinstance(step, Copy) and step.sources == ("config",)]
    assert copied.dest == str(path.parent)  # COPY config /etc/kvgate
    local = ROOT / "config" / path.name
    assert local.is_file()
    assert not [name for name in image.env if name.startswith("KVGATE_BACKEND")]
    for name in [name for name in os.environ if name.startswith("KVGATE_")]:
        monkeypatch.delenv(name)
    for name, value in image.env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(local)
    assert settings.server.host == "0.0.0.0" and settings.server.port == 11435
    assert settings.backends[0].url == "http://ollama:11434"
    monkeypatch.setenv("KVGATE_BACKEND__URL", "http://host.docker.internal:11434")  # docker run -e ...
    assert load_settings(local).backends[0].url == "http://host.docker.internal:11434"


async def test_an_unreachable_loopback_backend_is_explained(caplog: pytest.LogCaptureFixture) -> None:
    """127.0.0.1 in a container is the container: the warning about an unreachable backend says so."""
    async with running_gateway([{"name": "ollama", "url": "http://127.0.0.1:9"}],
                               admission={"probe_wait_s": 0.2}) as url, \
            aiohttp.ClientSession() as http:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{url}/api/chat", json=chat) as response:
            assert response.status in (502, 503)
    assert any("KVGATE_BACKEND__URL" in record.getMessage() for record in caplog.records
               if record.name == "gateway.backends.registry")


@pytest.mark.parametrize("text", [
    "FROM a\nARG VERSION", "FROM a\nADD x /y", "FROM a AS build", "FROM a\nFROM b", "FROM a\nCOPY --chown=1 x /y",
    "FROM a\nCOPY *.toml /y/", "FROM a\nCOPY ../x /y", "FROM a\nRUN a; b", "FROM a\nRUN a | b", "FROM a\nRUN a > f",
    "FROM a\nRUN echo $HOME", "FROM a\nRUN --mount=type=cache,target=/c pip install .", "FROM a\nRUN [\"a\"]",
    "FROM a\nCMD kvgate serve", "FROM a\nENV A 1", "FROM a\nENV A=$B", "# syntax=docker/dockerfile:1\nFROM a",
    "FROM a\nRUN <<EOF\nx\nEOF", "FROM a\nHEALTHCHECK --bogus=1 CMD true", "FROM a\nRUN a \\",
])  # fmt: skip
def test_the_dockerfile_reader_refuses_what_it_does_not_know(tmp_path: Path, text: str) -> None:
    """Every form the replay could get wrong fails loudly: a Dockerfile change cannot skip steps in silence."""
    (tmp_path / "Dockerfile").write_text(text + "\n")
    with pytest.raises(DockerfileError):
        read_image(tmp_path / "Dockerfile")


def test_the_replay_refuses_a_run_command_it_cannot_replay(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM a\nRUN pip install . && apt-get install -y curl\n")
    with pytest.raises(DockerfileError, match="no replayer for 'apt-get'"):
        replay(read_image(tmp_path / "Dockerfile"), tmp_path, tmp_path / "root")
    assert not (tmp_path / "root").exists()  # refused before anything ran


def test_the_replay_refuses_a_copy_of_a_missing_path(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM a\nCOPY missing /opt/\n")
    with pytest.raises(DockerfileError, match="COPY missing: no such path"):
        replay(read_image(tmp_path / "Dockerfile"), tmp_path, tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_the_replay_refuses_a_copy_of_what_dockerignore_leaves_out(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / ".dockerignore").write_text("# not in the image\ntests\n**/__pycache__\n")
    (tmp_path / "Dockerfile").write_text("FROM a\nCOPY tests /opt/tests\n")
    with pytest.raises(DockerfileError, match="leaves it out"):
        replay(read_image(tmp_path / "Dockerfile"), tmp_path, tmp_path / "root")


# The image itself, in a container engine.


@pytest.mark.container
def test_the_image_builds_and_serves_in_a_container_engine() -> None:
    """Built from the Dockerfile; the simulated Ollama runs from the same image, and kvgate's container joins its
    network namespace (as containers of one pod do), so the backend is its 127.0.0.1:11434 and kvgate's 11435 is
    published from that namespace, on the host's 127.0.0.1 only."""
    engine = _engine()
    if isinstance(engine, str):
        pytest.skip(engine)
    image, run_id = _image(), uuid.uuid4().hex[:10]
    tag, sim, gate = f"localhost/kvgate-test:{run_id}", f"kvgate-test-sim-{run_id}", f"kvgate-test-{run_id}"
    assert image.healthcheck is not None
    try:
        engine.run("build", "-t", tag, str(ROOT), timeout_s=900)
        engine.run("run", "-d", "--name", sim, "-p", "127.0.0.1::11435", "--entrypoint", "kvgate", tag, "sim",
                   "--host", "127.0.0.1", "--port", "11434", *SIM_ARGS)  # fmt: skip
        engine.run("run", "-d", "--name", gate, "--network", f"container:{sim}",
                   "-e", "KVGATE_BACKEND__URL=http://127.0.0.1:11434", tag)  # fmt: skip
        published = engine.published(sim, "11435/tcp")
        assert published.startswith("127.0.0.1:"), published
        health = image.healthcheck.command
        until_sync(lambda: engine.run("exec", gate, *health, check=False).returncode == 0,
                   timeout_s=START_TIMEOUT_S, interval_s=1.0)  # fmt: skip
        assert engine.run("exec", gate, "id", "-u").stdout.strip() not in {"0", ""}
        assert _chat(f"http://{published}")
        cache = image.env["KVGATE_COUNTING__CACHE_DIR"]  # in the VOLUME, written by the image's user
        until_sync(lambda: engine.run("exec", gate, "ls", cache, check=False).stdout.strip(), timeout_s=30,
                   interval_s=1.0)  # fmt: skip
        demo = engine.run("exec", gate, "kvgate", "demo", "--part", "one-model", timeout_s=DEMO_TIMEOUT_S)
        requests, completed = _demo_completed(demo.stdout)
        assert requests > 0 and completed == requests, demo.stdout
        print(f"\n{engine.program}: image {tag} built and served; kvgate demo in it:\n{demo.stdout}")
    finally:
        engine.run("rm", "-f", gate, sim, check=False)
        engine.run("rmi", "-f", tag, check=False)


# Where no engine can run: the Dockerfile's steps in a clean virtual environment.


@asynccontextmanager
async def _entrypoint(replayed: Replayed, env: dict[str, str]) -> AsyncIterator[str]:
    """The image's ENTRYPOINT + CMD, run from its WORKDIR with ``env``, until it logs where it listens: its URL."""
    process = await asyncio.create_subprocess_exec(
        *replayed.resolve(replayed.image.argv), env=env, cwd=replayed.path(replayed.image.workdir),
        stderr=asyncio.subprocess.PIPE)  # fmt: skip
    assert process.stderr is not None
    try:
        while True:
            line = (await asyncio.wait_for(process.stderr.readline(), timeout=START_TIMEOUT_S)).decode()
            assert line, f"{' '.join(replayed.image.argv)} exited before it listened ({await process.wait()})"
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if found:
                break
        yield found.group(1)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _healthcheck(replayed: Replayed, env: dict[str, str]) -> int:
    """The HEALTHCHECK's command as the engine runs it (in the image's environment): its exit status, within the
    HEALTHCHECK's own timeout."""
    assert replayed.image.healthcheck is not None
    process = await asyncio.create_subprocess_exec(*replayed.resolve(replayed.image.healthcheck.command), env=env,
                                                   stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    return await asyncio.wait_for(process.wait(), timeout=_healthcheck_timeout_s(replayed.image))


@pytest.mark.container
async def test_the_images_steps_run_in_a_clean_virtual_environment(tmp_path: Path) -> None:
    engine = await asyncio.to_thread(_engine)
    if not isinstance(engine, str):
        pytest.skip(f"{engine.program} builds and runs the image itself (the test above)")
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim

    started = time.monotonic()
    replayed = await asyncio.to_thread(replay, _image(), ROOT, tmp_path / "image")
    replayed.timings_s["replay"] = time.monotonic() - started
    print(f"\n{engine}\nreplayed {DOCKERFILE} under {replayed.root} (python {sys.version.split()[0]} for the base "
          f"image's); skipped: " + "; ".join(replayed.skipped))
    runner, sim_url = await start_sim(SimConfig(models=(MODEL,), load_s=0.01, time_scale=50.0))
    try:
        env = replayed.env(KVGATE_SERVER__HOST="127.0.0.1", KVGATE_SERVER__PORT=str(free_port()),
                           KVGATE_BACKEND__URL=sim_url)  # fmt: skip
        assert await _healthcheck(replayed, env) != 0  # nothing listens yet: the check checks
        async with _entrypoint(replayed, env) as url:
            assert await _healthcheck(replayed, env) == 0
            assert await asyncio.to_thread(_chat, url)
            cache = Path(env["KVGATE_COUNTING__CACHE_DIR"])
            assert cache.is_relative_to(replayed.root)
            await until(lambda: cache.is_dir() and any(cache.iterdir()), timeout_s=30, interval_s=0.1)
    finally:
        await runner.cleanup()
    started = time.monotonic()
    demo = await asyncio.create_subprocess_exec(*replayed.resolve(("kvgate", "demo", "--part", "one-model")),
                                                env=replayed.env(), stdout=asyncio.subprocess.PIPE)  # fmt: skip
    output = (await asyncio.wait_for(demo.communicate(), timeout=DEMO_TIMEOUT_S))[0].decode()
    replayed.timings_s["demo"] = time.monotonic() - started
    assert demo.returncode == 0, output
    requests, completed = _demo_completed(output)
    assert requests > 0 and completed == requests, output
    print(output + "\ntimings (s): " + ", ".join(f"{name} {value:.1f}" for name, value in replayed.timings_s.items()))


def test_the_replayed_image_is_read_under_its_root(tmp_path: Path) -> None:
    """Its environment is the image's (none of the test's own KVGATE_* settings), its paths under its root; a
    program the steps did not make is the host's, standing for the base image's."""
    replayed = Replayed(_image(), tmp_path)
    env = replayed.env()
    assert {name for name in env if name.startswith("KVGATE_")} == {name for name in _image().env
                                                                     if name.startswith("KVGATE_")}
    assert env["KVGATE_COUNTING__CACHE_DIR"] == str(tmp_path / "var/cache/kvgate/tokenizers")
    assert env["PATH"].split(":")[0] == str(tmp_path / "usr/local/bin")
    assert replayed.resolve(("/bin/sh", "-c", "true")) == ["/bin/sh", "-c", "true"]
    assert replayed.resolve(("sh", "/etc/kvgate/docker.toml"))[1] == str(tmp_path / "etc/kvgate/docker.toml")


@pytest.mark.parametrize(("path", "left_out"), [
    ("gateway/app.py", False), ("gateway/__pycache__/app.cpython-311.pyc", True), ("kvsim/gpu/__pycache__", True),
    ("tests", True), ("tests/deploy/test_container.py", True), (".venv/bin/python", True),
    ("config/docker.toml", False),
])  # fmt: skip
def test_dockerignore_is_read_as_the_engines_read_it(path: str, left_out: bool) -> None:
    """The repository's own .dockerignore: what the replay copies is what the engine's build context holds."""
    assert ignored(PurePosixPath(path), ignore_patterns(ROOT)) is left_out
