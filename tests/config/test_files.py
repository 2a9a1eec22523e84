"""Several --config files read as one (gateway/config/files.py): merged table by table, a setting in two files an
error naming it and both files (never its value), and the fingerprint a watcher compares."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.files import fingerprint
from gateway.config.settings import ConfigError, load_settings, sha256_hex
from tests.support.kubelet_mounts import publish

POLICY = """[server]
require_api_key = true
[[backends]]
name = "gpu-a"
url = "http://127.0.0.1:9"
[tenants.ci]
max_active = 2
"""
KEYS = '[tenants.ci]\napi_keys = ["ci-secret-key"]\n[tenants.team]\napi_keys = ["team-secret-key"]\n'


def _files(tmp_path: Path, *texts: str) -> list[Path]:
    paths = []
    for index, text in enumerate(texts):
        path = tmp_path / f"part{index}.toml"
        path.write_text(text)
        paths.append(path)
    return paths


def test_two_files_merge_table_by_table(tmp_path: Path) -> None:
    settings = load_settings(_files(tmp_path, POLICY, KEYS))
    ci = settings.tenants["ci"]
    assert (ci.max_active, ci.digests()) == (2, [sha256_hex("ci-secret-key")])  # caps from one, keys from the other
    assert settings.tenants["team"].digests() == [sha256_hex("team-secret-key")]
    assert [b.name for b in settings.backends] == ["gpu-a"] and settings.server.require_api_key
    one = load_settings(_files(tmp_path, POLICY.replace("require_api_key = true", "require_api_key = false")))
    assert one.tenants["ci"].digests() == [] and one.tenants["ci"].max_active == 2  # one file: as before


@pytest.mark.parametrize(("second", "setting"), [
    ('[tenants.ci]\nmax_active = 3\napi_keys = ["ci-secret-key"]\n', "tenants.ci.max_active"),
    ('[[backends]]\nname = "gpu-b"\nurl = "http://127.0.0.1:9"\n', "backends"),
    ('[server]\nrequire_api_key = false\n', "server.require_api_key"),
])
def test_a_setting_in_two_files_is_refused_naming_it_and_both_files(
    tmp_path: Path, second: str, setting: str,
) -> None:
    first, other = _files(tmp_path, POLICY, second)
    with pytest.raises(ConfigError) as refused:
        load_settings([first, other])
    message = str(refused.value)
    assert f"setting '{setting}' is in both '{first}' and '{other}'" in message
    assert "secret" not in message and "gpu-b" not in message  # names, never values


@pytest.mark.parametrize("broken", ["[tenants.ci\n", 'api_keys = ["unterminated]\n'])
def test_a_file_that_is_not_toml_is_named(tmp_path: Path, broken: str) -> None:
    good, bad = _files(tmp_path, POLICY, broken)
    with pytest.raises(ConfigError, match=r"setting '--config' = '.*part0\.toml', '.*part1\.toml' is invalid"):
        load_settings([good, bad])


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    (good,) = _files(tmp_path, POLICY)
    with pytest.raises(ConfigError, match=r"setting '--config' = '.*absent\.toml' is invalid: no such file"):
        load_settings([good, tmp_path / "absent.toml"])


def test_the_fingerprint_follows_a_kubelet_swap_and_waits_out_a_missing_file(tmp_path: Path) -> None:
    volume = tmp_path / "config"
    publish(volume, 1, {"kvgate.toml": POLICY})
    path = volume / "kvgate.toml"
    before = fingerprint([path])
    assert before is not None and fingerprint([path]) == before
    publish(volume, 2, {"kvgate.toml": POLICY.replace("max_active = 2", "max_active = 3")})
    assert fingerprint([path]) not in (None, before)
    assert fingerprint([path, tmp_path / "absent.toml"]) is None
