"""The I/O of ``kvgate check``: ask each backend what it holds, read its VRAM source, read the host. Every answer is
kept raw too (``Gathered.answers``) for the support bundle. Nothing here raises for an unreachable or odd backend:
the problem becomes part of the readings."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from gateway.backends import Backend, BackendCallError, BackendClient
from gateway.backends.probes import BackendProbes, local_profile
from gateway.cli.check.backend_log import LogSettings
from gateway.cli.check.readings import BackendReadings, ResidentModel, resolve_settings
from gateway.config.settings import BackendSettings
from gateway.memory.sources.common import ProfileError
from gateway.memory.sources.llama_server_answers import (
    parse_models,
    parse_props,
    parse_slots,
    profile_from_llama_server,
)
from gateway.memory.sources.ollama_answers import parse_ps, parse_tags, profile_from_show
from gateway.memory.vram import VramUnavailable
from gateway.runtimes import runtime_for
from gateway.support.gguf_reader import read_gguf
from gateway.support.redact import mask_in, mask_url

ANSWER_TIMEOUT_S = 10.0


@dataclass
class Answers:
    """Raw answers by path, for the bundle; a failed call is kept as its error text."""

    by_path: dict[str, Any] = field(default_factory=dict)


async def _get(client: BackendClient, answers: Answers, method: str, path: str, body: Any = None) -> Any:
    key = path if body is None else f"{path} {body.get('model', '')}"
    try:
        value = await client.request_json(method, path, body, timeout_s=ANSWER_TIMEOUT_S)
    except BackendCallError as exc:
        answers.by_path[key] = {"kvgate_check_error": exc.message}
        raise
    answers.by_path[key] = value
    return value


async def _ollama(client: BackendClient, answers: Answers) -> tuple[str | None, tuple[ResidentModel, ...]]:
    version = (await _get(client, answers, "GET", "/api/version")).get("version")
    loaded = parse_ps(await _get(client, answers, "GET", "/api/ps"))
    try:
        tags = parse_tags(await _get(client, answers, "GET", "/api/tags"))
    except (BackendCallError, ProfileError):
        tags = {}
    residents = []
    for model in loaded:
        try:
            show = await _get(client, answers, "POST", "/api/show", {"model": model.name})
            tag = tags.get(model.name)
            size = tag.size_bytes if tag else None
            residents.append(ResidentModel(model, profile_from_show(model.name, show, size_bytes=size)))
        except (BackendCallError, ProfileError, ValueError) as exc:
            residents.append(ResidentModel(model, None, f"/api/show: {exc}"))
    return (str(version) if version else None), tuple(residents)


async def _llama(client: BackendClient, answers: Answers, config: BackendSettings) -> dict[str, Any]:
    props = parse_props(await _get(client, answers, "GET", "/props"))
    found: dict[str, Any] = {"props": props, "slots": (), "profile": None, "notes": []}
    try:
        found["slots"] = tuple(parse_slots(await _get(client, answers, "GET", "/slots")))
    except (BackendCallError, ProfileError) as exc:
        found["notes"].append(f"/slots not read ({exc}); per-slot state unknown")
    try:
        meta = parse_models(await _get(client, answers, "GET", "/v1/models"))
        path = config.gguf_path or Path(props.model_path)
        gguf = read_gguf(path) if path and Path(path).is_file() else None  # noqa: ASYNC240 (a stat, once)
        found["profile"] = profile_from_llama_server(props, meta, gguf, fallback=local_profile(props.model_alias))
    except (BackendCallError, ProfileError, ValueError, OSError) as exc:
        found["notes"].append(f"model profile unknown: {exc}")
    return found


async def read_backend(
    session: aiohttp.ClientSession, config: BackendSettings, log: LogSettings, answers: Answers
) -> BackendReadings:
    client = BackendClient.for_backend(session, config)
    kind = str(config.kind)
    base = BackendReadings(name=config.name, kind=kind, url=config.shown_url,
                           settings=resolve_settings(kind, config, log, None))
    try:
        base = replace(base, vram=await BackendProbes(session).vram(Backend(config, client,
                                                                                runtime=runtime_for(config.kind))))
    except VramUnavailable as exc:
        base = replace(base, vram_problem=str(exc))
    try:
        if kind == "ollama":
            version, residents = await _ollama(client, answers)
            return replace(base, version=version, residents=residents)
        if kind == "llama-server":
            found = await _llama(client, answers, config)
            return replace(base, version=found["props"].build_info or None, props=found["props"],
                           slots=found["slots"], served_profile=found["profile"], notes=tuple(found["notes"]),
                           settings=resolve_settings(kind, config, log, found["props"]))
    except BackendCallError as exc:
        return replace(base, problem=f"backend '{config.name}' not read: {exc.message}")
    except (ProfileError, ValueError) as exc:
        return replace(base, problem=f"backend '{config.name}' answered something unreadable: {exc}")
    return replace(base, notes=("an OpenAI-style server reports no memory settings",))


async def longest_seen(session: aiohttp.ClientSession, gateway: str, admin_key: str | None) -> tuple[int, str] | None:
    """The longest prompt a running kvgate has counted (``longest_prompts`` of its ``/kvgate/status``), and where;
    None when it can't be read (it says why on stderr) or has counted none yet."""
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    url = f"{gateway.rstrip('/')}/kvgate/status"
    shown = mask_url(url)  # --gateway may carry a password: printed masked
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as response:
            if response.status != 200:
                print(f"kvgate: {shown} answered {response.status} (an admin key: --admin-key or "
                      "KVGATE_ADMIN_KEY)", file=sys.stderr)
                return None
            status = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        print(f"kvgate: could not read {shown}: {mask_in(str(exc), url) or type(exc).__name__}", file=sys.stderr)
        return None
    rows = [row for row in status.get("longest_prompts", []) if isinstance(row.get("tokens"), int)]
    if not rows:
        return None
    top = max(rows, key=lambda row: row["tokens"])
    where = f"counted by kvgate at {gateway} ({top.get('backend')}, model '{top.get('model') or '-'}')"
    return top["tokens"], where
