"""Values put into shell text where placeholders stand, each quoted for the context it lands in. Pure.

The one renderer of sweep commands (`{lr}`) and playbook run steps (`{{ lr }}`): a value quoted with
shlex.quote lands safely only outside quotes; inside '...' its own quotes would close the user's, and inside
"..." `$(...)` would still run. So the template's literal text is read as POSIX sh reads it (quotes,
backslashes, `$( )`) and each value is written for where it stands:

    bare           shlex.quote(value)
    '...'          value, each ' written '\\''
    "..."          value, with \\ $ ` " backslashed
    `...`, $'...', after a here-document (<<): refused, with how to write it instead
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable

from clusterctl.errors import UsageError

BARE, SINGLE, DOUBLE, BACKTICK, ANSI, HEREDOC = "bare", "single", "double", "backtick", "ansi", "heredoc"


def fill(
    text: str,
    pattern: re.Pattern[str],
    value_of: Callable[[re.Match[str]], str],
    raw: Callable[[re.Match[str]], bool] = lambda _m: False,
) -> str:
    """`text` with every match of `pattern` replaced by value_of(match), quoted for its context (raw(match):
    put in as it is, the user's own opt-out). UsageError for a placeholder where no quoting is safe."""
    out: list[str] = []
    scanner = _Scanner()
    at = 0
    for m in pattern.finditer(text):
        scanner.feed(text[at : m.start()])
        out.append(text[at : m.start()])
        value = str(value_of(m))
        out.append(value if raw(m) else quote_for(scanner.context, value, m.group(0)))
        at = m.end()
    out.append(text[at:])
    return "".join(out)


def quote_for(context: str, value: str, placeholder: str) -> str:
    if context == BARE:
        return shlex.quote(value)
    if context == SINGLE:
        return value.replace("'", "'\\''")
    if context == DOUBLE:
        return re.sub(r'([\\$`"])', r"\\\1", value)
    where, how = {
        BACKTICK: ("inside `...`", "write $(...) instead of backticks"),
        ANSI: ("inside $'...'", "put it outside those quotes"),
        HEREDOC: ("after a here-document (<<)", "give the value as an argument, e.g. printf '%s\\n' " + placeholder),
    }[context]
    raise UsageError(f"{placeholder} cannot be quoted for the shell {where}", how)


@dataclass
class _Frame:
    context: str
    parens: int = 0  # ( opened inside this frame and not yet closed
    substitution: bool = False  # opened by $( : its ) closes it


class _Scanner:
    """POSIX sh's quoting state over the literal text fed so far: a stack of contexts; `$(` opens a bare
    frame (closed by its `)`) inside any of them."""

    def __init__(self) -> None:
        self.stack = [_Frame(BARE)]
        self.escaped = False

    @property
    def context(self) -> str:
        return self.stack[-1].context

    def feed(self, text: str) -> None:  # noqa: C901 (a character-level shell lexer: one state machine, its cases read together)
        i = 0
        while i < len(text):
            c, nxt = text[i], text[i + 1 : i + 2]
            frame = self.stack[-1]
            ctx = frame.context
            i += 1
            if ctx == HEREDOC:
                continue  # the rest of the text: no placeholder is quoted there
            if self.escaped:
                self.escaped = False
                continue
            if ctx == SINGLE:
                if c == "'":
                    self.stack.pop()
                continue
            if c == "\\":
                self.escaped = True
                continue
            if ctx == ANSI:
                if c == "'":
                    self.stack.pop()
                continue
            if ctx == BACKTICK:
                if c == "`":
                    self.stack.pop()
                continue
            if c == "$" and nxt == "(":
                self.stack.append(_Frame(BARE, substitution=True))
                i += 1
            elif c == "`":
                self.stack.append(_Frame(BACKTICK))
            elif ctx == DOUBLE:
                if c == '"':
                    self.stack.pop()
            elif c == "$" and nxt == "'":
                self.stack.append(_Frame(ANSI))
                i += 1
            elif c == "'":
                self.stack.append(_Frame(SINGLE))
            elif c == '"':
                self.stack.append(_Frame(DOUBLE))
            elif c == "(":
                frame.parens += 1
            elif c == ")":
                if frame.parens:
                    frame.parens -= 1
                elif frame.substitution:
                    self.stack.pop()
            elif c == "<" and nxt == "<":
                if text[i + 1 : i + 2] == "<":  # <<< a here-string: one word, read as any other
                    i += 2
                else:
                    self.stack.append(_Frame(HEREDOC))
