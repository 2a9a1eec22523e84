"""config/kvgate.toml is valid and mentions every setting kvgate has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.config.settings import BackendSettings, Settings, load_settings

EXAMPLE = Path(__file__).parents[2] / "config" / "kvgate.toml"


def _setting_names(model: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= _setting_names(annotation)
    return names


def test_example_config_loads_with_the_defaults() -> None:
    settings = load_settings(EXAMPLE)
    assert settings == load_settings(None, default_backend="ollama")


def test_example_config_documents_every_setting() -> None:
    text = EXAMPLE.read_text()
    missing = sorted(name for name in _setting_names(Settings) | _setting_names(BackendSettings)
                     if f"{name} =" not in text and f"[{name}" not in text and f"[[{name}" not in text
                     and f".{name}]" not in text)
    assert missing == []


def test_docker_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGATE_BACKEND__URL", raising=False)
    settings = load_settings(EXAMPLE.with_name("docker.toml"))
    assert settings.server.host == "0.0.0.0" and settings.backends[0].url == "http://ollama:11434"
    monkeypatch.setenv("KVGATE_BACKEND__URL", "http://gpu-host:11434")  # docker run -e ... (tests/deploy)
    assert load_settings(EXAMPLE.with_name("docker.toml")).backends[0].url == "http://gpu-host:11434"


def test_every_toml_block_of_the_readme_loads(tmp_path: Path) -> None:
    """The configuration the README shows is configuration kvgate accepts (unknown keys are errors)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", readme, re.DOTALL)
    assert blocks
    for index, block in enumerate(blocks):
        path = tmp_path / f"block-{index}.toml"
        path.write_text(block)
        load_settings(path)
