"""docker-compose.yml and deploy/replicas/compose.yml (issue 15, point 4; issue 27, point 3).

No engine needed: each file is checked against the Compose Specification's JSON schema (the copy check-jsonschema
ships), every file it names exists (build contexts and their Dockerfile, bind mounts, secrets), every kvgate service
loads its config as its container would (the image's ENV, then the service's environment, then its command; the
config file found where the container would see it: a bind mount, or what the image COPY'd), and the load balancer's
upstreams are the kvgate services on their port. With ``docker compose`` or ``podman-compose`` installed, that tool's
``config`` accepts each file too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from gateway.config.settings import Settings, load_settings
from tests.support.dockerfile import Copy, Image, read_image

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "docker-compose.yml"
REPLICAS = ROOT / "deploy" / "replicas" / "compose.yml"
FILES = [COMPOSE, REPLICAS]
ADMIN_KEY = "a-long-random-admin-key-for-the-test"
"""What a required variable (``${KVGATE_ADMIN_KEY:?...}``) is set to here."""
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")
PLAIN_VARIABLE = re.compile(r"^\$\{(\w+)(?::-([^}]*))?\}$")


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def _service(name: str) -> dict[str, Any]:
    service: dict[str, Any] = _load(COMPOSE)["services"][name]
    return service


def _interpolated(value: object) -> str:
    """A value as compose reads it with no variable set: ``${V:-default}`` its default, ``${V:?message}`` ADMIN_KEY
    (compose refuses to start without it); a variable with neither fails the test."""
    def one(found: re.Match[str]) -> str:
        assert found.group(2) is not None, f"${{{found.group(1)}}} has no default and is not required"
        return ADMIN_KEY if "?" in found.group(2) else found.group(3)

    return VARIABLE.sub(one, str(value))


def _devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = service["deploy"]["resources"]["reservations"]["devices"]
    return devices


def _variable(value: str) -> tuple[str, str | None]:
    found = PLAIN_VARIABLE.match(str(value))
    assert found, f"{value!r} is not one ${{VARIABLE:-default}}"
    return found.group(1), found.group(2)


def _mounts(service: dict[str, Any], base: Path) -> Iterator[tuple[str, str]]:
    """(source, target) of each volume: a bind mount's source resolved against the compose file's directory."""
    for volume in service.get("volumes", []):
        source, target = (volume.split(":")[:2] if isinstance(volume, str)
                          else (volume["source"], volume["target"]))  # fmt: skip
        yield (str(base / source) if source.startswith((".", "/")) else source), target


def _kvgate_services(path: Path) -> dict[str, dict[str, Any]]:
    """The services built from this repository's Dockerfile."""
    found = {}
    for name, service in _load(path)["services"].items():
        build = service.get("build")
        context = build if isinstance(build, str) else (build or {}).get("context")
        if context is not None and (path.parent / context).resolve() == ROOT:
            found[name] = service
    return found


def _file_in_container(image: Image, service: dict[str, Any], base: Path, image_path: str) -> Path:
    """Where ``image_path`` comes from for the container: the deepest bind mount over it, else what the image
    COPY'd there (a directory's contents); failing if neither provides it."""
    path = PurePosixPath(image_path)
    mounts = [(source, PurePosixPath(target)) for source, target in _mounts(service, base) if source.startswith("/")]
    for source, target in sorted(mounts, key=lambda mount: len(mount[1].parts), reverse=True):
        if path == target or target in path.parents:
            return Path(source) / path.relative_to(target)
    for step in reversed(image.steps):
        if isinstance(step, Copy) and len(step.sources) == 1 and (ROOT / step.sources[0]).is_dir():
            dest = PurePosixPath(step.dest)
            if dest in path.parents:
                return ROOT / step.sources[0] / path.relative_to(dest)
    raise AssertionError(f"{image_path} is neither mounted into the container nor COPY'd into the image")


def _container_settings(path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, Path]:
    """The settings service ``name`` of ``path`` starts with, and the config file it loads."""
    image, service = read_image(ROOT / "Dockerfile"), _kvgate_services(path)[name]
    for variable in [variable for variable in os.environ if variable.startswith("KVGATE_")]:
        monkeypatch.delenv(variable)
    for variable, value in {**image.env, **service.get("environment", {})}.items():
        monkeypatch.setenv(variable, _interpolated(value))
    command = service.get("command") or list(image.cmd)
    config = _file_in_container(image, service, path.parent, command[command.index("--config") + 1])
    assert config.is_file(), config
    return load_settings(config), config


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_compose_file_follows_the_compose_spec(path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(path)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_spec_check_catches_a_mistake(tmp_path: Path) -> None:
    """The schema check bites: a misspelt key (``command`` as ``comand``) fails it."""
    wrong = tmp_path / "compose.yml"
    wrong.write_text("services:\n  kvgate:\n    build: .\n    comand: [serve]\n")
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(wrong)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "comand" in done.stdout + done.stderr


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_every_file_a_compose_file_names_exists(path: Path) -> None:
    document = _load(path)
    services, named = document["services"], set(document.get("volumes") or {})
    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            context = path.parent / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            assert (context / dockerfile).is_file(), f"{name}: no {dockerfile} in {context}"
            read_image(context / dockerfile)  # one the container tests can read (and replay)
        else:
            assert service.get("image"), f"{name} has neither build nor image"
        for source, target in _mounts(service, path.parent):
            assert Path(source).exists() if source.startswith("/") else source in named, f"{name}: {source}:{target}"
        for secret in service.get("secrets", []):
            assert (secret if isinstance(secret, str) else secret["source"]) in document.get("secrets", {}), name
        depends = service.get("depends_on", [])
        for needed, how in (depends.items() if isinstance(depends, dict) else ((each, {}) for each in depends)):
            assert needed in services, f"{name} depends on {needed}, no such service"
            if how.get("condition") == "service_healthy":
                assert "healthcheck" in services[needed] or services[needed].get("build"), f"{needed}: no healthcheck"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    for secret in (document.get("secrets") or {}).values():
        assert "environment" in secret or (path.parent / secret["file"]).is_file(), secret


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_every_kvgate_service_loads_its_config_as_its_container_would(path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the service's own environment may change a backend of its config file: the image's ENV names none (it
    once set KVGATE_BACKEND__URL, which replaced the replicas' first GPU host by http://ollama:11434)."""
    assert _kvgate_services(path)
    for name, service in _kvgate_services(path).items():
        settings, config = _container_settings(path, name, monkeypatch)
        written = {table["name"]: table.get("url") for table in _toml_backends(config)}
        own = {key: _interpolated(value) for key, value in service.get("environment", {}).items()}
        for index, backend in enumerate(settings.backends):
            wanted = own.get("KVGATE_BACKEND__URL") if index == 0 and "KVGATE_BACKEND__URL" in own else None
            assert backend.url == (wanted or written[backend.name]), f"{path.name} {name}: {backend.name}"
        assert settings.server.host == "0.0.0.0" and settings.server.admin_key is not None


def _toml_backends(config: Path) -> list[dict[str, Any]]:
    backends: list[dict[str, Any]] = tomllib.loads(config.read_text()).get("backends", [])
    return backends


def test_replicas_share_one_redis_ledger_behind_nginx(monkeypatch: pytest.MonkeyPatch) -> None:
    document = _load(REPLICAS)
    replicas = _kvgate_services(REPLICAS)
    ports = set()
    for name in replicas:
        settings, _ = _container_settings(REPLICAS, name, monkeypatch)
        assert settings.shared_ledger.redis_url is not None
        assert settings.shared_ledger.redis_url.get_secret_value() == "redis://redis:6379/0"
        assert settings.shared_ledger.replicas == len(replicas)
        ports.add(settings.server.port)
    assert "redis" in document["services"] and "healthcheck" in document["services"]["redis"]
    lb = document["services"]["lb"]
    (conf,) = [Path(source) for source, target in _mounts(lb, REPLICAS.parent) if target == "/etc/nginx/nginx.conf"]
    upstreams = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", conf.read_text(), re.MULTILINE)
    assert {host for host, _ in upstreams} == set(replicas) == set(lb["depends_on"])
    assert {int(port) for _, port in upstreams} == ports
    (listen,) = re.findall(r"^\s*listen\s+(\d+);", conf.read_text(), re.MULTILINE)
    assert [str(port).rsplit(":", 1)[1] for port in lb["ports"]] == [listen]


def test_compose_runs_ollama_on_the_gpu_and_kvgate_in_front() -> None:
    ollama, kvgate = _service("ollama"), _service("kvgate")
    assert any(device["driver"] == "nvidia" and "gpu" in device["capabilities"] for device in _devices(ollama))
    assert "ports" not in ollama  # every request goes through kvgate
    assert kvgate["depends_on"]["ollama"]["condition"] == "service_healthy"
    assert kvgate["environment"]["KVGATE_BACKEND__URL"] == "http://ollama:11434"


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
    settings, _ = _container_settings(COMPOSE, "kvgate", monkeypatch)
    backend = settings.backends[0]
    assert (backend.url, backend.parallel, backend.context_tokens, backend.vram) == (
        "http://ollama:11434", 2, 8192, "nvml")
    assert settings.admission.default_context_tokens == 8192 and settings.server.admin_key is not None
    assert settings.server.admin_key.get_secret_value() == ADMIN_KEY


def test_compose_runs_prometheus_scraping_kvgate() -> None:
    prometheus = _service("prometheus")
    mounts = {target: Path(source) for source, target in _mounts(prometheus, COMPOSE.parent)}
    assert (mounts["/etc/prometheus"] / "prometheus.yml").is_file()
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "kvgate_admin_key" in prometheus["secrets"]
    assert _load(COMPOSE)["secrets"]["kvgate_admin_key"]["environment"] == "KVGATE_ADMIN_KEY"
    scrape = yaml.safe_load((mounts["/etc/prometheus"] / "prometheus.yml").read_text())
    job = scrape["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/run/secrets/kvgate_admin_key"
    assert job["metrics_path"] == "/kvgate/metrics"


def _compose_tool() -> list[str] | None:
    """``docker compose`` (the plugin) or ``podman-compose``, whichever is installed and answers."""
    candidates = [["docker", "compose"], ["podman-compose"]]
    for tool in candidates:
        if shutil.which(tool[0]) and subprocess.run([*tool, "version"], capture_output=True,
                                                    timeout=30).returncode == 0:  # fmt: skip
            return tool
    return None


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_the_compose_tool_accepts_the_file(path: Path) -> None:
    tool = _compose_tool()
    if tool is None:
        pytest.skip("neither `docker compose` nor podman-compose is installed (the compose-spec schema check ran)")
    done = subprocess.run([*tool, "-f", str(path), "config"], capture_output=True, text=True, timeout=60,
                          env={"KVGATE_ADMIN_KEY": ADMIN_KEY, "PATH": os.environ["PATH"]})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
