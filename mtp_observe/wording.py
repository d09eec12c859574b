"""Counts in words: '1 session', '2 sessions', '1,024 tokens' (every printed count goes through `plural`)."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """n and the word, singular for exactly one: plural(1, "session") -> "1 session", plural(1024, "token") -> "1,024 tokens"."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
