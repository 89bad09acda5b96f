"""A request's state inside the engine, and the events the engine emits about it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool_client import BlockKey


@dataclass(slots=True)
class Request:
    """One generation request and its progress.

    ``tokens`` is the prompt followed by the output so far; ``computed`` counts the
    leading tokens whose K/V are in ``pages``. Decoding feeds the last sampled token,
    so a request never computes its final output token.
    """

    rid: str
    prompt: list[int]
    max_new_tokens: int
    arrival: float
    tokens: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    keys: list[BlockKey] = field(default_factory=list)  # keys of the full blocks of ``tokens``, in order
    pages: list[int] = field(default_factory=list)
    computed: int = 0
    registered: int = 0  # leading full blocks recorded in the prefix cache
    local_hit_tokens: int = 0
    pool_hit_tokens: int = 0
    loaded_bytes: int = 0
    first_token_at: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt or self.max_new_tokens < 1:
            raise ValueError("a request needs a prompt and at least one new token")
        self.tokens = list(self.prompt)

    @property
    def fed_tokens(self) -> int:
        """Tokens whose K/V the request will hold at most: prompt + output minus the last output token."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The request's first output token was sampled at ``at`` (time.monotonic)."""

    rid: str
    token: int
    at: float


@dataclass(frozen=True, slots=True)
class Finished:
    """The request produced all its tokens; what it reused and loaded."""

    rid: str
    output: tuple[int, ...]
    at: float
    prompt_tokens: int
    local_hit_tokens: int
    pool_hit_tokens: int
    loaded_bytes: int
    first_token_at: float


Event = FirstToken | Finished
