"""The README's settings reference is the one the settings models render: a new setting without its row fails."""

from __future__ import annotations

from pathlib import Path

from gateway.config.reference import END, START, render, replace_section
from gateway.config.settings import Settings

README = Path(__file__).parents[2] / "README.md"


def test_readme_settings_reference_is_up_to_date() -> None:
    text = README.read_text()
    assert replace_section(text) == text, "run: python -m gateway.config.reference --write README.md"


def test_every_setting_has_a_row_with_its_variable_and_default() -> None:
    table = render()
    for name in Settings.model_fields:
        assert f"| `{name}" in table
    for row in ("| `server.log_contents` | `KVGATE_SERVER__LOG_CONTENTS` | `false` | UNSAFE",
                "| `backend.url` | `KVGATE_BACKEND__URL` | `unset` |",
                "| `admission.queue_order` | `KVGATE_ADMISSION__QUEUE_ORDER` | `fair` |",
                "| `tenants.NAME.weight` | `KVGATE_TENANTS__<NAME>__WEIGHT` | `1.0` |",
                "| `server.max_body_bytes` | `KVGATE_SERVER__MAX_BODY_BYTES` | `32.0MiB` |",
                "| `residency.when_gpu_full` | `KVGATE_RESIDENCY__WHEN_GPU_FULL` | `offload` | a load that can't fit",
                "| `residency.allow_cpu_offload` | `KVGATE_RESIDENCY__ALLOW_CPU_OFFLOAD` | `unset` | deprecated: use "
                "when_gpu_full",
                "| `backends[].cpu_offload` | (in the list's JSON) | `auto` | Ollama: whether it loads a model too big",
                "| `admission.probe_wait_s` | `KVGATE_ADMISSION__PROBE_WAIT_S` | `10.0` | how long requests wait for a "
                "backend's KV layout before a 503; a backend that refuses connections and answered nothing this long "
                "is down: 502 at once"):
        assert row in table


def test_replace_section_renews_only_the_table() -> None:
    stale = f"# title\n\nbefore\n{START}\n| old |\n{END}\nafter\n"
    assert replace_section(stale) == f"# title\n\nbefore\n{START}\n{render()}{END}\nafter\n"
