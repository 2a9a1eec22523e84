"""Ollama request ``options``: parsing, defaults, and when a request forces a reload.

Precedence (``Server.modelOptions``): defaults -> the Modelfile's PARAMETERs -> the request's ``options``.
Unknown keys are ignored; a wrongly typed value is ``option "<k>" must be of type integer`` (or boolean,
float32, array), which Ollama answers with 500 (``api/types.go`` ``FromMap``).

Load-time keys (``api.Runner``) decide whether a loaded runner can serve a request (``server/sched.go``
``needsReload``, E3): num_ctx is clamped to the trained context first; two automatic num_ctx (no num_ctx in the
request or Modelfile, OLLAMA_CONTEXT_LENGTH 0) compare equal, as do two automatic num_batch; num_gpu < 0 never
reloads; a different ``shift`` reloads. E2 compares the raw values (no clamp, no automatic handling). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

_INT_KEYS = frozenset(
    {
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "num_thread",
        "draft_num_predict",
        "num_keep",
        "seed",
        "num_predict",
        "top_k",
        "repeat_last_n",
    }
)
_FLOAT_KEYS = frozenset(
    {"top_p", "min_p", "typical_p", "temperature", "repeat_penalty", "presence_penalty", "frequency_penalty"}
)
_BOOL_KEYS = frozenset({"use_mmap"})
_LIST_KEYS = frozenset({"stop"})


class OptionError(ValueError):
    """A wrongly typed option; the message is Ollama's."""


@dataclass(frozen=True)
class RunnerOptions:
    """``api.Runner``: the options a runner is started with."""

    num_ctx: int
    num_batch: int = 512
    num_gpu: int = -1
    main_gpu: int | None = None
    use_mmap: bool | None = None
    num_thread: int = 0
    draft_num_predict: int = 0


@dataclass(frozen=True)
class Options:
    runner: RunnerOptions
    num_ctx_auto: bool
    num_batch_auto: bool
    num_keep: int = 4
    seed: int = -1
    num_predict: int = -1
    temperature: float = 0.8
    stop: tuple[str, ...] = ()


def _check(key: str, value: Any) -> Any:
    if key in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(f'option "{key}" must be of type integer')
        return int(value)
    if key in _FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(f'option "{key}" must be of type float32')
        return float(value)
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise OptionError(f'option "{key}" must be of type boolean')
        return value
    if not isinstance(value, list):
        raise OptionError(f'option "{key}" must be of type array')
    if not all(isinstance(item, str) for item in value):
        raise OptionError(f'option "{key}" must be of an array of strings')
    return tuple(value)


def _known(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    known = _INT_KEYS | _FLOAT_KEYS | _BOOL_KEYS | _LIST_KEYS
    return {k: _check(k, v) for k, v in (raw or {}).items() if k in known and v is not None}


def parse_options(
    request: Mapping[str, Any] | None,
    *,
    modelfile: Mapping[str, Any],
    default_num_ctx: int,
    context_length_env: int,
    embedding: bool,
) -> Options:
    """The merged options of one request (OptionError on a bad type)."""
    merged = {**_known(modelfile), **_known(request)}
    num_ctx_auto = "num_ctx" not in merged and context_length_env == 0
    num_batch_auto = "num_batch" not in merged
    num_ctx = merged.get("num_ctx", context_length_env or default_num_ctx)
    num_batch = merged.get("num_batch", 512)
    if embedding and num_batch_auto:
        num_batch = min(2048, num_ctx)  # llm.DefaultEmbeddingNumBatchForContext
    runner = RunnerOptions(
        num_ctx=num_ctx,
        num_batch=num_batch,
        num_gpu=merged.get("num_gpu", -1),
        main_gpu=merged.get("main_gpu"),
        use_mmap=merged.get("use_mmap"),
        num_thread=merged.get("num_thread", 0),
        draft_num_predict=merged.get("draft_num_predict", 0),
    )
    return Options(
        runner=runner,
        num_ctx_auto=num_ctx_auto,
        num_batch_auto=num_batch_auto and not embedding,
        num_keep=merged.get("num_keep", 4),
        seed=merged.get("seed", -1),
        num_predict=merged.get("num_predict", -1),
        temperature=merged.get("temperature", 0.8),
        stop=merged.get("stop", ()),
    )


def schedule_num_ctx(num_ctx: int, *, vision: bool) -> int:
    """``getRunner``: num_ctx < 4 becomes 4; vision models get at least 2048."""
    num_ctx = max(num_ctx, 4)
    return max(num_ctx, 2048) if vision else num_ctx


def effective_context(num_ctx: int, n_ctx_train: int) -> int:
    """Clamp to the trained context (``effectiveContext``)."""
    return n_ctx_train if 0 < n_ctx_train < num_ctx else num_ctx


@dataclass(frozen=True)
class LoadedState:
    """What ``needsReload`` compares against: the loaded runner's options and flags."""

    runner: RunnerOptions
    num_ctx_auto: bool
    num_batch_auto: bool
    context_shift: bool
    n_ctx_train: int


def needs_reload(loaded: LoadedState, request: Options, *, shift: bool, era: str) -> bool:
    """Whether a request must reload the runner (``runnerRef.needsReload``)."""
    existing, new = loaded.runner, request.runner
    if era == "e3":
        new = replace(new, num_ctx=effective_context(new.num_ctx, loaded.n_ctx_train))
        if loaded.num_ctx_auto and request.num_ctx_auto:
            new = replace(new, num_ctx=existing.num_ctx)
        if loaded.num_batch_auto and request.num_batch_auto:
            new = replace(new, num_batch=existing.num_batch)
        if new.use_mmap is None:
            new = replace(new, use_mmap=existing.use_mmap)
        if loaded.context_shift != shift:
            return True
    if new.num_gpu < 0:
        existing, new = replace(existing, num_gpu=-1), replace(new, num_gpu=-1)
    return existing != new
