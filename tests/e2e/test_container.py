"""The image and docker-compose.yml (issue 15, point 4). Without a Docker daemon these check the files and load the
configuration exactly as the container would: the Dockerfile's CMD file, with its ENV applied. With one (``docker
info`` succeeds), the image is built and its health check's command runs in it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config.settings import load_settings
from tests.support.gateway_server import running_gateway

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
VARIABLE = re.compile(r"^\$\{(\w+)(?::-([^}]*))?\}$")


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    found = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in _instructions():
        if keyword == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _service(name: str) -> dict[str, Any]:
    service: dict[str, Any] = _compose()["services"][name]
    return service


def _devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = service["deploy"]["resources"]["reservations"]["devices"]
    return devices


def _variable(value: str) -> tuple[str, str | None]:
    found = VARIABLE.match(str(value))
    assert found, f"{value!r} is not one ${{VARIABLE:-default}}"
    return found.group(1), found.group(2)


def test_image_runs_as_a_non_root_user_with_a_health_check() -> None:
    instructions = _instructions()
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    (check,) = [rest for keyword, rest in instructions if keyword == "HEALTHCHECK"]
    assert "/kvgate/health" in check and "CMD" in check


def test_image_default_config_points_at_the_backend_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    (cmd,) = [rest for keyword, rest in _instructions() if keyword == "CMD"]
    args = json.loads(cmd)
    path = Path(args[args.index("--config") + 1])
    copied = [rest.split() for keyword, rest in _instructions() if keyword == "COPY" and rest.split()[0] == "config"]
    assert copied and copied[0][1] == str(path.parent)  # COPY config /etc/kvgate
    local = ROOT / "config" / path.name
    assert local.is_file()
    assert "url" not in local.read_text().split("[[backends]]", 1)[1].split("#")[0]  # the URL is the environment's
    env = _image_env()
    assert env["KVGATE_BACKEND__URL"] == "http://ollama:11434"
    for name in [name for name in os.environ if name.startswith("KVGATE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(local)
    assert settings.server.host == "0.0.0.0" and settings.server.port == 11435
    assert settings.backends[0].url == "http://ollama:11434"
    monkeypatch.setenv("KVGATE_BACKEND__URL", "http://host.docker.internal:11434")  # docker run -e ...
    assert load_settings(local).backends[0].url == "http://host.docker.internal:11434"


def test_compose_runs_ollama_on_the_gpu_and_kvgate_in_front() -> None:
    ollama, kvgate = _service("ollama"), _service("kvgate")
    assert any(device["driver"] == "nvidia" and "gpu" in device["capabilities"] for device in _devices(ollama))
    assert "ports" not in ollama  # every request goes through kvgate
    assert kvgate["depends_on"]["ollama"]["condition"] == "service_healthy"
    for service in _compose()["services"].values():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port
    assert kvgate["environment"]["KVGATE_BACKEND__URL"] == "http://ollama:11434"
    command = kvgate["command"]
    assert (ROOT / "config" / Path(command[command.index("--config") + 1]).name).is_file()


def test_compose_keeps_the_contexts_in_step() -> None:
    ollama, kvgate = _service("ollama")["environment"], _service("kvgate")["environment"]
    context = _variable(ollama["OLLAMA_CONTEXT_LENGTH"])
    parallel = _variable(ollama["OLLAMA_NUM_PARALLEL"])
    assert _variable(kvgate["KVGATE_BACKEND__CONTEXT_TOKENS"]) == context
    assert _variable(kvgate["KVGATE_ADMISSION__DEFAULT_CONTEXT_TOKENS"]) == context
    assert _variable(kvgate["KVGATE_BACKEND__PARALLEL"]) == parallel
    assert context[1] and parallel[1]  # defaults, the same in every place


def test_compose_gives_kvgate_a_vram_source() -> None:
    kvgate = _service("kvgate")
    assert kvgate["environment"]["KVGATE_BACKEND__VRAM"] == "nvml"
    assert any(device["driver"] == "nvidia" and "utility" in device["capabilities"] for device in _devices(kvgate))


def test_compose_loads_kvgate_as_the_container_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's ENV, then compose's environment (its variables at their defaults), then the compose command."""
    kvgate = _service("kvgate")
    for name in [name for name in os.environ if name.startswith("KVGATE_")]:
        monkeypatch.delenv(name)
    for name, value in {**_image_env(), **kvgate["environment"]}.items():
        found = VARIABLE.match(str(value))
        if found and found.group(2) is None:
            value = "a-long-random-admin-key"
        elif found:
            value = found.group(2).split(":?")[0]
        monkeypatch.setenv(name, str(value))
    command = kvgate["command"]
    settings = load_settings(ROOT / "config" / Path(command[command.index("--config") + 1]).name)
    backend = settings.backends[0]
    assert (backend.url, backend.parallel, backend.context_tokens, backend.vram) == (
        "http://ollama:11434", 2, 8192, "nvml")
    assert settings.admission.default_context_tokens == 8192 and settings.server.admin_key is not None


def test_compose_runs_prometheus_scraping_kvgate() -> None:
    prometheus = _service("prometheus")
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in prometheus["volumes"]}
    assert (ROOT / mounts["/etc/prometheus"] / "prometheus.yml").is_file()
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "kvgate_admin_key" in prometheus["secrets"]
    assert _compose()["secrets"]["kvgate_admin_key"]["environment"] == "KVGATE_ADMIN_KEY"
    scrape = yaml.safe_load((ROOT / mounts["/etc/prometheus"] / "prometheus.yml").read_text())
    job = scrape["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/run/secrets/kvgate_admin_key"
    assert job["metrics_path"] == "/kvgate/metrics"


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0


def _compose_cli() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "compose", "version"], capture_output=True, timeout=20).returncode == 0


@pytest.mark.skipif(not _compose_cli(), reason="docker compose is not installed")
def test_docker_compose_accepts_the_file() -> None:
    subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], check=True, capture_output=True,
                   env={"KVGATE_ADMIN_KEY": "a-long-random-admin-key", "PATH": "/usr/local/bin:/usr/bin:/bin"})


@pytest.mark.skipif(not _docker_daemon(), reason="no Docker daemon")
def test_image_builds_and_answers_its_health_check() -> None:
    subprocess.run(["docker", "build", "-q", "-t", "kvgate-test", str(ROOT)], check=True, timeout=900)
    done = subprocess.run(["docker", "run", "--rm", "kvgate-test", "--help"], capture_output=True, timeout=120)
    assert done.returncode == 0 and b"serve" in done.stdout
    user = subprocess.run(["docker", "run", "--rm", "--entrypoint", "id", "kvgate-test", "-u"], capture_output=True,
                          timeout=120)
    assert user.stdout.strip() not in (b"0", b"")


async def test_an_unreachable_loopback_backend_is_explained(caplog: pytest.LogCaptureFixture) -> None:
    """127.0.0.1 in a container is the container: the warning about an unreachable backend says so."""
    async with running_gateway([{"name": "ollama", "url": "http://127.0.0.1:9"}],
                               admission={"probe_wait_s": 0.2}) as url, \
            aiohttp.ClientSession() as http:
        chat = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{url}/api/chat", json=chat) as response:
            assert response.status in (502, 503)
    assert any("KVGATE_BACKEND__URL" in record.getMessage() for record in caplog.records
               if record.name == "gateway.backends.registry")
