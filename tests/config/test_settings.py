"""Settings: TOML, then KVGATE_* environment variables, then flags; invalid values stop start-up clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import build_parser, main, settings_from_args
from gateway.config.settings import DEFAULT_PORT, ConfigError, load_settings, parse_backend_flag
from gateway.domain import BackendKind

TOML = """
[server]
port = 9000
host = "127.0.0.2"

[[backends]]
name = "gpu0"
kind = "llama-server"
url = "http://127.0.0.1:8080"
api_key = "top-secret"
timeouts = { connect_s = 2, first_byte_s = 30, idle_s = 10 }
"""


def test_defaults_listen_on_loopback_in_front_of_local_ollama(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", DEFAULT_PORT)
    assert [(b.name, b.kind, b.url) for b in settings.backends] == [("ollama", BackendKind.OLLAMA,
                                                                    "http://127.0.0.1:11434")]


def test_precedence_toml_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kvgate.toml"
    path.write_text(TOML)
    settings = load_settings(path)
    assert settings.server.port == 9000 and settings.backends[0].timeouts.first_byte_s == 30
    monkeypatch.setenv("KVGATE_SERVER__PORT", "9100")
    assert load_settings(path).server.port == 9100
    assert load_settings(path).server.host == "127.0.0.2"
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "9200"])
    assert settings_from_args(args).server.port == 9200


def test_secrets_stay_out_of_reprs(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.toml"
    path.write_text(TOML)
    settings = load_settings(path)
    assert "top-secret" not in repr(settings) and "top-secret" not in str(settings.model_dump())
    assert settings.backends[0].api_key is not None
    assert settings.backends[0].api_key.get_secret_value() == "top-secret"


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("http://127.0.0.1:11434", {"name": "default", "url": "http://127.0.0.1:11434"}),
        ("llama-server=http://127.0.0.1:8080", {"name": "llama-server", "kind": "llama-server",
                                                "url": "http://127.0.0.1:8080"}),
        ("gpu1:openai=http://127.0.0.1:8000", {"name": "gpu1", "kind": "openai", "url": "http://127.0.0.1:8000"}),
    ],
)
def test_backend_flag_forms(flag: str, expected: dict[str, str]) -> None:
    assert parse_backend_flag(flag, 0) == expected


def test_repeated_backend_flags_build_named_backends() -> None:
    args = build_parser().parse_args(
        ["serve", "--backend", "ollama=http://127.0.0.1:11434", "--backend", "llama-server=http://127.0.0.1:8080"])
    settings = settings_from_args(args)
    assert [(b.name, b.kind) for b in settings.backends] == [
        ("ollama", BackendKind.OLLAMA), ("llama-server1", BackendKind.LLAMA_SERVER)]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"backends": [{"name": "a", "kind": "olama"}]},
         "setting 'backends.0.kind' = 'olama' is invalid: Input should be 'ollama', 'llama-server' or 'openai'"),
        ({"backends": [{"name": "a", "url": "ftp://x"}]}, "setting 'backends.0.url' = 'ftp://x' is invalid"),
        ({"server": {"port": 70000}}, "setting 'server.port' = 70000 is invalid: Input should be less than or equal"),
        ({"server": {"max_body_bytes": "lots"}}, "setting 'server.max_body_bytes' = 'lots'"),
        ({"server": {"prot": 1}}, "setting 'server.prot' is invalid: Extra inputs are not permitted"),
        ({"backends": [{"name": "a", "url": "http://127.0.0.1:11434/v1"}]},
         "setting 'backends.0.url' = 'http://127.0.0.1:11434/v1' is invalid: Value error, must be the server's root"),
        ({"server": {"admin_key": " "}}, "setting 'server.admin_key' is invalid: Value error, must not be empty"),
        ({"backends": [{"name": "a"}, {"name": "a"}]}, "backend names must be unique; repeated: a"),
        ({"default_backend": "b"}, "default_backend 'b' is not a backend; known: ollama"),
        ({"tenants": {"ci": {"weight": 0}}}, "setting 'tenants.ci.weight' is invalid: Input should be greater than 0"),
        ({"admission": {"queue_order": "lifo"}},
         "setting 'admission.queue_order' = 'lifo' is invalid: Input should be 'fair' or 'arrival'"),
    ],
)
def test_invalid_settings_name_setting_value_and_allowed(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, **overrides)
    assert expected in str(caught.value)


def test_invalid_setting_stops_start_up(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_SERVER__PORT", "not-a-port")
    assert main(["serve"]) == 2
    assert "setting 'server.port' = 'not-a-port' is invalid" in capsys.readouterr().err


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_settings(tmp_path / "nope.toml")
