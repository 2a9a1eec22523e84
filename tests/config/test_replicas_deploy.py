"""deploy/replicas (issue 16, point 5): three replicas, one Redis, one load balancer. Without a Docker daemon these
check the files and load the configuration every replica would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gateway.config.settings import load_settings
from tests.support.container_env import environment, image_environment

DEPLOY = Path(__file__).parents[2] / "deploy" / "replicas"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    return loaded


def test_every_replica_loads_the_same_file_and_shares_one_redis() -> None:
    services = _compose()["services"]
    replicas = {name: service for name, service in services.items() if name.startswith("kvgate-")}
    assert len(replicas) == 3
    commands = {tuple(service["command"]) for service in replicas.values()}
    assert commands == {("serve", "--config", "/etc/kvgate/replicas.toml")}
    for service in replicas.values():
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "./kvgate.toml:/etc/kvgate/replicas.toml:ro" in service["volumes"]
        assert "ports" not in service  # only the load balancer is published
    assert services["redis"]["healthcheck"]["test"][-1] == "ping"
    assert services["lb"]["ports"] == ["127.0.0.1:11435:11435"]


def test_the_replicas_configuration_loads_with_a_shared_ledger_and_several_hosts() -> None:
    settings = load_settings(DEPLOY / "kvgate.toml")
    shared = settings.shared_ledger
    assert shared.redis_url is not None and shared.redis_url.get_secret_value() == "redis://redis:6379/0"
    assert (shared.on_unreachable, shared.replicas) == ("local_share", 3)
    assert len(settings.backends) >= 2 and settings.server.host == "0.0.0.0"


def test_the_load_balancer_sends_to_every_replica_and_streams_unbuffered() -> None:
    conf = (DEPLOY / "nginx.conf").read_text()
    assert set(re.findall(r"server (kvgate-\d):11435", conf)) == {"kvgate-1", "kvgate-2", "kvgate-3"}
    assert "proxy_buffering off;" in conf and "listen 11435;" in conf


def test_every_replica_runs_the_files_backends_under_the_images_environment() -> None:
    """The image once set KVGATE_BACKEND__URL (docker-compose.yml's Ollama), and a replica running with it sent the
    first GPU host's requests there (it replaces backends[0].url): under the image's environment the file's
    backends stand."""
    service = _compose()["services"]["kvgate-1"]
    variables = dict(image_environment())
    variables |= {name: "a-long-random-admin-key" for name in service["environment"]}
    with environment(variables):
        settings = load_settings(DEPLOY / "kvgate.toml")
    assert [backend.url for backend in settings.backends] == ["http://gpu-a.internal:8080", "http://gpu-b.internal:8080"]
