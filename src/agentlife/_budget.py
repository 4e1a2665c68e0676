"""The job's token, cost and run-time budgets."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from agentlife._agent import BudgetView
from agentlife._exceptions import BudgetExhausted
from agentlife.constants import BudgetConstants

__all__ = ["Budget", "estimate_input_tokens", "format_usd", "largest_message"]


def format_usd(value: float) -> str:
    """Dollars as people read them; small amounts keep enough digits to differ from zero."""
    return f"{value:.2f}" if value >= 0.1 or value == 0 else f"{value:.4f}"


def estimate_input_tokens(messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> int:
    """A conservative guess of a request's input tokens (about 4 bytes per token), made before sending it."""
    size = len(orjson.dumps(list(messages), default=str))
    if "system" in params:
        size += len(orjson.dumps(params["system"], default=str))
    if "tools" in params:
        size += len(orjson.dumps(params["tools"], default=str))
    return max(1, size // 4)


def largest_message(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """``"its largest message, #3 (user, tool_result), holds about 7864321 tokens"``, or None without any."""
    if not messages:
        return None
    sizes = [len(orjson.dumps(message, default=str)) for message in messages]
    position = max(range(len(sizes)), key=sizes.__getitem__)
    message = messages[position]
    role = str(message.get("role", "?"))[:20] if isinstance(message, Mapping) else "?"
    content = message.get("content") if isinstance(message, Mapping) else None
    kinds = sorted(
        {str(b.get("type"))[:20] for b in content if isinstance(b, Mapping)}
        if isinstance(content, list)
        else ()
    )
    what = f"{role}, {' and '.join(kinds)}" if kinds else role
    return f"its largest message, #{position} ({what}), holds about {max(1, sizes[position] // 4)} tokens"


@dataclass(slots=True)
class Budget:
    """Tracks consumption against the limits; the job row's ``token_budget`` overrides the defaults."""

    max_input_tokens: int
    max_cost_usd: float
    run_max_seconds: float | None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    started_monotonic: float = 0.0

    @classmethod
    def build(
        cls,
        constants: BudgetConstants,
        row_budget: Mapping[str, Any] | None,
        consumed: Mapping[str, Any] | None,
    ) -> Budget:
        """Limits from the row (when set) or the constants, consumption from the row."""
        row_budget = row_budget or {}
        consumed = consumed or {}
        return cls(
            max_input_tokens=int(row_budget.get("max_input_tokens", constants.max_input_tokens)),
            max_cost_usd=float(row_budget.get("max_cost_usd", constants.max_cost_usd)),
            # 0 (or -0.0) means unlimited, as for AGENTLIFE_RUN_MAX_SECONDS=0.
            run_max_seconds=constants.run_max_seconds or None,
            input_tokens=int(consumed.get("input", 0)),
            output_tokens=int(consumed.get("output", 0)),
            cost_usd=float(consumed.get("cost_usd", 0.0)),
            started_monotonic=time.monotonic(),
        )

    def exhausted_message(self) -> str:
        """The reason recorded on the job row."""
        return f"token budget exhausted (${format_usd(self.cost_usd)} / ${format_usd(self.max_cost_usd)} max)"

    def check_before_call(
        self, estimated_input_tokens: int, messages: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        """Raise `BudgetExhausted` if the next call would go over a limit; it is then never made.

        Args:
            estimated_input_tokens: the next request's input tokens (`estimate_input_tokens`).
            messages: the request's messages: when the request alone is over the input-token limit, the
                reason names the largest (a 30 MB tool result, say).
        """
        if self.cost_usd >= self.max_cost_usd:
            raise BudgetExhausted(self.exhausted_message())
        if self.input_tokens + estimated_input_tokens > self.max_input_tokens:
            raise BudgetExhausted(self.input_exhausted_message(estimated_input_tokens, messages))
        self.check_run_time()

    def input_exhausted_message(
        self, estimated_input_tokens: int, messages: Sequence[Mapping[str, Any]] = ()
    ) -> str:
        """The reason recorded when the next request would go over the input-token limit."""
        text = (
            f"token budget exhausted ({self.input_tokens} input tokens used + about {estimated_input_tokens} "
            f"in the next request > {self.max_input_tokens} input tokens max"
        )
        if estimated_input_tokens > self.max_input_tokens:
            text += "; that request alone is over the limit"
            largest = largest_message(messages)
            if largest:
                text += f": {largest}"
        return text + ")"

    def check_run_time(self) -> None:
        """Raise `BudgetExhausted` once the run-time budget (``AGENTLIFE_RUN_MAX_SECONDS``) is spent."""
        remaining = self.run_seconds_remaining()
        if remaining is not None and remaining <= 0:
            raise BudgetExhausted(f"run time budget exhausted ({self.run_max_seconds:g} s max)")

    def run_seconds_remaining(self) -> float | None:
        """Seconds left of the run budget, None when unlimited."""
        if self.run_max_seconds is None:
            return None
        return self.run_max_seconds - (time.monotonic() - self.started_monotonic)

    def add(self, totals: Mapping[str, Any]) -> None:
        """Adopt the totals the store returned after adding a call's usage."""
        self.input_tokens = int(totals.get("input", self.input_tokens))
        self.output_tokens = int(totals.get("output", self.output_tokens))
        self.cost_usd = float(totals.get("cost_usd", self.cost_usd))

    def view(self) -> BudgetView:
        """A snapshot for ``ctx.budget``."""
        return BudgetView(
            input_tokens_remaining=max(0, self.max_input_tokens - self.input_tokens),
            cost_usd_remaining=max(0.0, self.max_cost_usd - self.cost_usd),
            run_seconds_remaining=self.run_seconds_remaining(),
            input_tokens_used=self.input_tokens,
            cost_usd_used=self.cost_usd,
        )
