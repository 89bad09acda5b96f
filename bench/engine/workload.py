"""The benchmark's workload: multi-turn conversations about shared long documents.

Every prompt starts with one system prompt, then one of a few long documents, then
the conversation so far: each user message and the model's (greedy, so
deterministic) answer to it. Turn ``t + 1``'s prompt is turn ``t``'s prompt plus
its answer plus the next message, so every turn reuses the whole previous turn as
its prefix, and conversations about the same document share that document.
Everything is drawn from one seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Sizes of the workload, in tokens."""

    seed: int = 0
    vocab: int = 16384
    system_tokens: int = 64
    documents: int = 8
    document_tokens: int = 1024
    conversations: int = 24
    turns: int = 3
    message_tokens: tuple[int, int] = (32, 96)  # inclusive range of a user message's length
    output_tokens: int = 16


@dataclass(frozen=True, slots=True)
class Conversation:
    cid: int
    document: int
    messages: tuple[tuple[int, ...], ...]  # one user message per turn


@dataclass(frozen=True, slots=True)
class Workload:
    spec: WorkloadSpec
    system: tuple[int, ...]
    documents: tuple[tuple[int, ...], ...]
    conversations: tuple[Conversation, ...]

    def first_prompt(self, conversation: Conversation) -> list[int]:
        """Turn 0: system prompt, the conversation's document, its first message."""
        return [*self.system, *self.documents[conversation.document], *conversation.messages[0]]

    @staticmethod
    def next_prompt(
        conversation: Conversation, turn: int, previous_prompt: Sequence[int], previous_output: Sequence[int]
    ) -> list[int]:
        """Turn ``turn`` (>= 1): the previous prompt and answer, then the next message."""
        return [*previous_prompt, *previous_output, *conversation.messages[turn]]

    @property
    def requests(self) -> int:
        return len(self.conversations) * self.spec.turns

    def working_set_tokens(self) -> int:
        """Distinct prefix tokens the workload touches: what a cache would need to miss nothing."""
        s = self.spec
        own = sum(len(m) + s.output_tokens for c in self.conversations for m in c.messages)
        documents = len({c.document for c in self.conversations})
        return s.system_tokens + documents * s.document_tokens + own

    def prompt_tokens(self) -> int:
        """Sum of all prompt lengths: what a run without prefix reuse prefills."""
        s = self.spec
        total = 0
        for c in self.conversations:
            length = s.system_tokens + s.document_tokens
            for turn, message in enumerate(c.messages):
                length += len(message) + (s.output_tokens if turn else 0)
                total += length
        return total


def build_workload(spec: WorkloadSpec) -> Workload:
    """Draw the documents, the messages and which document each conversation is about from ``spec.seed``.

    Conversations cover the documents evenly (conversation ``i`` of a shuffled order
    takes document ``i % documents``), so every document is used and shared alike.
    """
    rng = random.Random(spec.seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(rng.randrange(spec.vocab) for _ in range(count))

    system = tokens(spec.system_tokens)
    documents = tuple(tokens(spec.document_tokens) for _ in range(spec.documents))
    low, high = spec.message_tokens
    subjects = [cid % spec.documents for cid in range(spec.conversations)]  # every document, evenly
    rng.shuffle(subjects)
    conversations = tuple(
        Conversation(cid, subject, tuple(tokens(rng.randint(low, high)) for _ in range(spec.turns)))
        for cid, subject in enumerate(subjects)
    )
    return Workload(spec, system, documents, conversations)


def long_prefix_prompts(
    spec: WorkloadSpec, trials: int, prefix_tokens: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """Pairs (first prompt, second prompt) sharing a long prefix of ``prefix_tokens``: for the recompute case."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(trials):
        prefix = [rng.randrange(spec.vocab) for _ in range(prefix_tokens)]
        first = prefix + [rng.randrange(spec.vocab) for _ in range(48)]
        second = prefix + [rng.randrange(spec.vocab) for _ in range(48)]
        pairs.append((first, second))
    return pairs
