"""How long a model's answers run: a running distribution of observed output lengths, per pool and per tenant.

Elastic reservations (``elastic.py``) reserve a streamed reply's prompt plus a high quantile of what its model has
answered lately, instead of its whole output limit:

    pool ('gpu0', 'llama3'), the last 512 answers:   p50 180, p95 610, longest 1,900 tokens
    a chat with a 500-token prompt, limit 1,524:     reserves 500 + 610 (p95), not 500 + 1,524;
                                                     the limit sent to the backend stays 1,524

Per tenant where the tenant has answers of its own (``min_samples`` of them), else the pool's; a pool with fewer
than ``min_samples`` is cold and ``expected`` answers None (the caller reserves the whole limit, as before). Each
series keeps the latest ``window`` lengths, so a model whose answers change (a new system prompt, a new client)
is followed within one window. The quantile is the nearest-rank one of the window, recomputed only when a new
length has come since it was last asked (a sort of at most ``window`` integers), so a request that reads it pays
a dictionary lookup.

An answer kvgate or the backend ended at a limit is a lower bound of what it wanted; it is recorded as it ran (the
distribution then leans short, and growth covers the rest). Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gateway.admission.types import PoolKey


@dataclass(slots=True)
class _Series:
    lengths: deque[int]
    sorted_lengths: list[int] | None = None
    cached_for: float = math.nan
    cached_tokens: int = 0

    def add(self, tokens: int) -> None:
        self.lengths.append(tokens)
        self.sorted_lengths = None

    def quantile(self, share: float) -> int:
        if self.sorted_lengths is None:
            self.sorted_lengths = sorted(self.lengths)
            self.cached_for = math.nan
        if share != self.cached_for:
            rank = max(1, math.ceil(share * len(self.sorted_lengths)))  # nearest rank: p95 of 20 is the 19th
            self.cached_tokens = self.sorted_lengths[rank - 1]
            self.cached_for = share
        return self.cached_tokens


@dataclass(slots=True)
class OutputLengths:
    """Observed output lengths per pool and per (pool, tenant); see the module docstring."""

    window: int = 512
    min_samples: int = 20
    _pools: dict[PoolKey, _Series] = field(default_factory=dict)
    _tenants: dict[tuple[PoolKey, str], _Series] = field(default_factory=dict)

    def observe(self, key: PoolKey, tenant: str, output_tokens: int) -> None:
        """One answer of ``output_tokens`` (negative figures are not lengths and are ignored)."""
        if output_tokens < 0:
            return
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Series(deque(maxlen=self.window))
        pool.add(output_tokens)
        own = self._tenants.get((key, tenant))
        if own is None:
            own = self._tenants[key, tenant] = _Series(deque(maxlen=self.window))
        own.add(output_tokens)

    def expected(self, key: PoolKey, tenant: str, quantile: float) -> int | None:
        """The ``quantile`` of the tenant's answers on the pool, else of the pool's; None while both are cold."""
        for series in (self._tenants.get((key, tenant)), self._pools.get(key)):
            if series is not None and len(series.lengths) >= self.min_samples:
                return series.quantile(quantile)
        return None

    def samples(self, key: PoolKey) -> int:
        """How many answers the pool's distribution holds (for the status page)."""
        series = self._pools.get(key)
        return 0 if series is None else len(series.lengths)

    def resize(self, window: int, min_samples: int) -> None:
        """New sizes (a configuration reload): each series keeps its latest ``window`` lengths."""
        self.min_samples = min_samples
        if window == self.window:
            return
        self.window = window
        for series in (*self._pools.values(), *self._tenants.values()):
            series.lengths = deque(series.lengths, maxlen=window)
            series.sorted_lengths = None
