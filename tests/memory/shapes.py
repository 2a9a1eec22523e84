"""Model shapes shared by the memory tests."""

from __future__ import annotations

from gateway.memory.kv import ModelShape


def dense_shape(
    *,
    n_layers: int = 32,
    n_head: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    n_ctx_train: int = 131072,
    architecture: str = "llama",
) -> ModelShape:
    return ModelShape(
        architecture=architecture,
        n_layers=n_layers,
        n_embd=n_head * head_dim,
        n_head=(n_head,) * n_layers,
        n_head_kv=(n_head_kv,) * n_layers,
        key_length=head_dim,
        value_length=head_dim,
        key_length_swa=head_dim,
        value_length_swa=head_dim,
        swa_layers=(False,) * n_layers,
        sliding_window=0,
        n_ctx_train=n_ctx_train,
    )


LLAMA_31_8B = dense_shape()
TINY = dense_shape(n_layers=2, n_head=4, n_head_kv=2, head_dim=16, n_ctx_train=8192)


def swa_shape(*, window: int = 1024, n_layers: int = 6, period: int = 6) -> ModelShape:
    """A gemma3-like shape: 5 of every 6 layers slide over ``window`` tokens."""
    return ModelShape(
        architecture="gemma3",
        n_layers=n_layers,
        n_embd=2048,
        n_head=(8,) * n_layers,
        n_head_kv=(4,) * n_layers,
        key_length=256,
        value_length=256,
        key_length_swa=256,
        value_length_swa=256,
        swa_layers=tuple(il % period < period - 1 for il in range(n_layers)),
        sliding_window=window,
        n_ctx_train=131072,
    )
