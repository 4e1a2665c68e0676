"""What a model call costs: `PriceTable` and `ModelPrice`.

Prices are USD per million tokens and are looked up by the **longest model-name prefix** in the table, so
``claude-sonnet-4-5-20250929`` finds ``claude-sonnet-4-5`` and a dated snapshot needs no entry of its own.
The default table holds Anthropic's and OpenAI's **list prices as published in 2025** (per million tokens,
uncached input / cached input / output); prices change, so check them against the providers' pricing pages
and override what differs. An unknown model (a self-hosted one behind vLLM or Ollama, say) costs 0.0 and is
logged once per table, because a wrong guess would corrupt the cost
budget while a zero at least says so in the log. Override or extend the defaults with
`PriceTable.with_prices`::

    prices = PriceTable.default().with_prices({"my-proxy-model": ModelPrice(input=2.0, output=8.0)})
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agentlife._llm._protocol import Usage

__all__ = ["DEFAULT_PRICES", "ModelPrice", "PriceTable"]

_log = logging.getLogger("agentlife.llm")

_PER_TOKEN = 1e-6
# Anthropic bills 5-minute cache writes at 1.25x the input price and cache reads at 0.1x.
_CACHE_WRITE_FACTOR = 1.25
_CACHE_READ_FACTOR = 0.1


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens of one model family.

    ``cache_write`` and ``cache_read`` default to Anthropic's multipliers of the input price
    (1.25x for 5-minute cache writes, 0.1x for cache reads).
    """

    input: float
    output: float
    cache_write: float | None = None
    cache_read: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_write", "cache_read"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"ModelPrice.{name} must be >= 0, got {value!r}")
        if self.cache_write is None:
            object.__setattr__(self, "cache_write", self.input * _CACHE_WRITE_FACTOR)
        if self.cache_read is None:
            object.__setattr__(self, "cache_read", self.input * _CACHE_READ_FACTOR)

    def cost_usd(self, usage: Usage) -> float:
        """The price of ``usage`` at these rates."""
        cache_write = self.cache_write if self.cache_write is not None else 0.0
        cache_read = self.cache_read if self.cache_read is not None else 0.0
        return _PER_TOKEN * (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_creation_input_tokens * cache_write
            + usage.cache_read_input_tokens * cache_read
        )


#: OpenAI list prices (USD per million tokens, 2025): input, cached input, output. OpenAI charges nothing
#: extra to write its prompt cache, so ``cache_write`` is the input price (its API reports no such tokens).
_OPENAI: Mapping[str, tuple[float, float | None, float]] = {
    "gpt-4o": (2.50, 1.25, 10.00),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "gpt-4.1": (2.00, 0.50, 8.00),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "o3": (2.00, 0.50, 8.00),
    "o3-mini": (1.10, 0.55, 4.40),
    "o3-pro": (20.00, None, 80.00),
    "o4-mini": (1.10, 0.275, 4.40),
    "gpt-5": (1.25, 0.125, 10.00),
    "gpt-5-mini": (0.25, 0.025, 2.00),
    "gpt-5-nano": (0.05, 0.005, 0.40),
    "gpt-5-pro": (15.00, None, 120.00),
}

#: Anthropic and OpenAI list prices (USD per million tokens) by model-name prefix; the longest matching
#: prefix wins. The bare Claude family prefixes (``claude-opus``, ``claude-sonnet``, ``claude-haiku``) price
#: model versions newer than this table at their family's latest known rates; override them when a release
#: changes that. A prefix also matches dated snapshots (``gpt-4o-2024-08-06``).
DEFAULT_PRICES: Mapping[str, ModelPrice] = MappingProxyType(
    {
        "claude-opus": ModelPrice(input=5.0, output=25.0),
        "claude-opus-4-1": ModelPrice(input=15.0, output=75.0),
        "claude-opus-4-0": ModelPrice(input=15.0, output=75.0),
        "claude-opus-4-2025": ModelPrice(input=15.0, output=75.0),
        "claude-sonnet": ModelPrice(input=3.0, output=15.0),
        "claude-haiku": ModelPrice(input=1.0, output=5.0),
        "claude-3-7-sonnet": ModelPrice(input=3.0, output=15.0),
        "claude-3-5-sonnet": ModelPrice(input=3.0, output=15.0),
        "claude-3-sonnet": ModelPrice(input=3.0, output=15.0),
        "claude-3-5-haiku": ModelPrice(input=0.8, output=4.0),
        "claude-3-opus": ModelPrice(input=15.0, output=75.0),
        "claude-3-haiku": ModelPrice(input=0.25, output=1.25),
        **{
            prefix: ModelPrice(
                input=uncached,
                output=output,
                cache_write=uncached,
                cache_read=uncached if cached is None else cached,
            )
            for prefix, (uncached, cached, output) in _OPENAI.items()
        },
    }
)


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Model-name prefixes to `ModelPrice`; immutable, extended with `with_prices`.

    Example:
        >>> from agentlife._llm._protocol import Usage
        >>> table = PriceTable.default()
        >>> round(table.cost_usd("claude-sonnet-4-5-20250929", Usage(input_tokens=1_000_000)), 2)
        3.0
    """

    entries: tuple[tuple[str, ModelPrice], ...] = ()
    """(prefix, price) pairs, longest prefix first, so the first match is the most specific."""
    # Which unknown models were already logged; bookkeeping only, so it takes no part in equality.
    _warned: set[str] = field(default_factory=set, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.entries, key=lambda entry: (-len(entry[0]), entry[0])))
        object.__setattr__(self, "entries", ordered)

    @classmethod
    def default(cls) -> PriceTable:
        """Anthropic's and OpenAI's list prices for their current models (`DEFAULT_PRICES`)."""
        return cls(tuple(DEFAULT_PRICES.items()))

    @classmethod
    def empty(cls) -> PriceTable:
        """A table that knows no model (every call costs 0.0)."""
        return cls()

    def with_prices(self, prices: Mapping[str, ModelPrice | Mapping[str, float]]) -> PriceTable:
        """A new table where ``prices`` add to or replace the entries of the same prefix.

        Args:
            prices: model-name prefix to a `ModelPrice`, or to a mapping with its fields
                (``{"input": 3.0, "output": 15.0}``).
        """
        merged = dict(self.entries)
        for prefix, price in prices.items():
            if not prefix:
                raise ValueError("a price table prefix must not be empty")
            merged[prefix] = price if isinstance(price, ModelPrice) else ModelPrice(**price)
        return PriceTable(tuple(merged.items()))

    def price_for(self, model: str) -> ModelPrice | None:
        """The price of the longest prefix of ``model`` in the table, or None."""
        for prefix, price in self.entries:
            if model.startswith(prefix):
                return price
        return None

    def cost_usd(self, model: str, usage: Usage) -> float:
        """USD for ``usage`` on ``model``; 0.0 (logged once per model) when the model is unknown."""
        price = self.price_for(model)
        if price is None:
            if model not in self._warned:
                self._warned.add(model)
                _log.warning(
                    "no price known for model %r: its calls count as 0.00 USD against the cost budget; "
                    "add it with PriceTable.default().with_prices({...})",
                    model,
                    extra={"fields": {"model": model}},
                )
            return 0.0
        return price.cost_usd(usage)

    def to_json(self) -> dict[str, Any]:
        """The table as plain data (for ``python -m agentlife check`` and the docs)."""
        return {
            prefix: {
                "input": price.input,
                "output": price.output,
                "cache_write": price.cache_write,
                "cache_read": price.cache_read,
            }
            for prefix, price in self.entries
        }
