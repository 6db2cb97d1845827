"""Counts in words, for messages and reports: '1 token', '2 tokens', '1 reply', '3 replies'."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun`, plural unless `n` is 1 (`plural`, else the noun with an s)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
