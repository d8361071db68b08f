"""What a table at 80 columns must be: no line over 80, no ellipsis, every value whole (its words in order on
one line or wrapped at spaces)."""

from __future__ import annotations

import re


def fits(text: str, words: list[str], columns: int = 80) -> None:
    lines = text.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, text
    assert "…" not in text and "..." not in text, text
    tokens = set(re.findall(r"\S+", text))
    missing = [w for w in words if not set(w.split()) <= tokens]
    assert missing == [], (missing, text)
