"""llama-server: /props, /v1/models and /slots answers -> profile facts (pure, no I/O).

llama-server does not report layer counts or head sizes, nor whether its KV pool is unified (llama-server.md
section 3): the shape comes from the GGUF at ``/props`` ``model_path`` (or a preset), and ``unified`` from the
backend configuration; ``check_unified`` warns when that configuration and the reported slot context disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.memory.kv import ModelShape, ServerFlags, ShapeError, llama_server_layout
from gateway.memory.profile import ModelProfile, ProfileSource
from gateway.memory.sources.common import ProfileError, as_int, n_ff_from, n_vocab_from, quantization_name
from gateway.support.gguf_reader import GgufSummary


@dataclass(frozen=True)
class ServerProps:
    """The parts of GET /props that size memory."""

    n_ctx_slot: int  # default_generation_settings.n_ctx: per-slot context
    total_slots: int
    model_path: str
    model_alias: str
    build_info: str
    is_sleeping: bool


@dataclass(frozen=True)
class ModelMeta:
    """GET /v1/models data[0].meta."""

    model_id: str
    n_ctx_train: int
    n_params: int
    size_bytes: int
    n_embd: int
    n_vocab: int
    n_ctx_slot: int | None


@dataclass(frozen=True)
class SlotState:
    """One element of GET /slots."""

    slot_id: int
    n_ctx: int
    is_processing: bool
    n_tokens: int  # tokens the slot holds in its KV now (prompt + generated)
    n_decoded: int
    n_remain: int | None


def parse_props(props: Mapping[str, Any]) -> ServerProps:
    settings = props.get("default_generation_settings")
    if not isinstance(settings, Mapping):
        raise ProfileError("/props has no default_generation_settings")
    return ServerProps(
        n_ctx_slot=as_int(settings.get("n_ctx"), "/props default_generation_settings.n_ctx"),
        total_slots=as_int(props.get("total_slots"), "/props total_slots"),
        model_path=str(props.get("model_path", "")),
        model_alias=str(props.get("model_alias", "")),
        build_info=str(props.get("build_info", "")),
        is_sleeping=bool(props.get("is_sleeping", False)),
    )


def parse_models(models: Mapping[str, Any]) -> ModelMeta:
    data = models.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0].get("meta"), Mapping):
        raise ProfileError("/v1/models has no data[0].meta")
    meta = data[0]["meta"]
    n_ctx = meta.get("n_ctx")
    return ModelMeta(
        model_id=str(data[0].get("id", "")),
        n_ctx_train=as_int(meta.get("n_ctx_train"), "/v1/models meta.n_ctx_train"),
        n_params=as_int(meta.get("n_params"), "/v1/models meta.n_params"),
        size_bytes=as_int(meta.get("size"), "/v1/models meta.size"),
        n_embd=as_int(meta.get("n_embd", 0), "/v1/models meta.n_embd"),
        n_vocab=as_int(meta.get("n_vocab", 0), "/v1/models meta.n_vocab"),
        n_ctx_slot=n_ctx if isinstance(n_ctx, int) else None,
    )


def parse_slots(slots: Sequence[Mapping[str, Any]]) -> list[SlotState]:
    states = []
    for slot in slots:
        next_token = slot.get("next_token")
        if isinstance(next_token, list):  # the code emits a one-element array, the README an object
            next_token = next_token[0] if next_token else {}
        if not isinstance(next_token, Mapping):
            next_token = {}
        remain = next_token.get("n_remain")
        states.append(
            SlotState(
                slot_id=as_int(slot.get("id"), "/slots id"),
                n_ctx=as_int(slot.get("n_ctx"), "/slots n_ctx"),
                is_processing=bool(slot.get("is_processing", False)),
                n_tokens=int(slot.get("n_prompt_tokens", 0) or 0),
                n_decoded=int(next_token.get("n_decoded", 0) or 0),
                n_remain=remain if isinstance(remain, int) else None,
            )
        )
    return states


def check_unified(
    *,
    configured_unified: bool,
    configured_parallel: int | None,
    configured_ctx_size: int | None,
    props: ServerProps,
    n_ctx_train: int,
) -> str | None:
    """A warning when the configured KV layout disagrees with what /props reports; None when consistent.

    /props does not say whether the pool is unified, but the per-slot n_ctx does: unified slots each see the
    whole pool, split slots a 1/n share. ``configured_ctx_size`` None or 0 means -c was not given.
    """
    if configured_parallel is not None and configured_parallel != props.total_slots:
        return (
            f"configured parallel={configured_parallel} but the server reports total_slots={props.total_slots}; "
            "fix the backend configuration (KV budgets use the configured value)"
        )
    if not configured_ctx_size or props.total_slots == 1:
        return None  # with one slot both layouts coincide; without -c the pool size is unknown (--fit)
    shape = _context_only_shape(n_ctx_train)
    predicted = {
        unified: llama_server_layout(
            shape, ServerFlags(ctx_size=configured_ctx_size, n_parallel=props.total_slots, unified=unified)
        ).n_ctx_slot
        for unified in (True, False)
    }
    if predicted[configured_unified] == props.n_ctx_slot or predicted[not configured_unified] != props.n_ctx_slot:
        return None
    said, seen = ("unified", "split") if configured_unified else ("split", "unified")
    return (
        f"backend configured as {said} KV but /props reports per-slot n_ctx={props.n_ctx_slot} with "
        f"{props.total_slots} slots, which matches a {seen} pool of -c {configured_ctx_size}; "
        f"set unified={not configured_unified} (llama-server -np without -kvu is split; no -np is unified)"
    )


def _context_only_shape(n_ctx_train: int) -> ModelShape:
    return ModelShape(
        architecture="unknown", n_layers=0, n_embd=0, n_head=(), n_head_kv=(), key_length=0, value_length=0,
        key_length_swa=0, value_length_swa=0, swa_layers=(), sliding_window=0, n_ctx_train=n_ctx_train,
    )


def profile_from_llama_server(
    props: ServerProps, meta: ModelMeta, gguf: GgufSummary | None, *, fallback: ModelProfile | None = None
) -> ModelProfile:
    """Profile of the model a llama-server serves: shape from its GGUF (or ``fallback``), sizes from /v1/models."""
    name = props.model_alias or meta.model_id or props.model_path
    if gguf is not None:
        try:
            shape = ModelShape.from_gguf_metadata(gguf.metadata)
        except ShapeError as exc:
            raise ProfileError(f"{gguf.path}: {exc}") from exc
        quant = quantization_name(gguf.metadata.get("general.file_type"))
        n_vocab, n_ff = n_vocab_from(gguf.metadata), n_ff_from(gguf.metadata)
        cache_key = f"gguf:{gguf.path}:{gguf.mtime_ns}"
    elif fallback is not None:
        shape, quant, n_vocab, n_ff = fallback.shape, fallback.quantization, fallback.n_vocab, fallback.n_ff
        cache_key = f"llama-server:{props.model_path}:{meta.size_bytes}"
    else:
        raise ProfileError(
            f"llama-server does not report layer counts; its model file {props.model_path!r} is not readable "
            "here: give the backend a GGUF path or a preset"
        )
    return ModelProfile(
        name=name,
        shape=shape,
        weights_bytes=meta.size_bytes,
        source=ProfileSource.LLAMA_SERVER,
        quantization=quant,
        context_tokens=props.n_ctx_slot,
        parallel=props.total_slots,
        parameter_count=meta.n_params,
        n_vocab=meta.n_vocab or n_vocab,
        n_ff=n_ff,
        cache_key=cache_key,
    )
