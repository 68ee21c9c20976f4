"""Where a code completion's block ends: the rule of the default model's function-completion
evaluation (tools/default_model/evaluation.py, `cut_completion_code_blank`), as a text-level stop.

The prompt's last non-blank line (the header, e.g. `def fibonacci(n):`) has indentation I. In
the completion, the block ends at the first line that is blank (whitespace only) or indented at
most I characters (leading whitespace counted as in `len(line) - len(line.lstrip())`), except
that lines inside a multi-line string (a docstring with a paragraph break) never end it. The
kept text ends with the newline before that line, so `header + text` is the function alone::

    def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1)\n\nprint(fib(3))
               |------------------ kept -----------------------------|^ blank line: ends here

The completion's first line (the rest of the header line) is never checked. `FunctionEndRule`
reads each character once, in order (a small lexer tracks comments and string literals, so a
triple quote split across tokens is still seen); one rule serves one request.
"""

from __future__ import annotations

import re

from deepinfer_engine.stop_match import StopMatch

WINDOW = 256   # characters a line's leading whitespace may span and still be decided
_BLOCK_HEADER = re.compile(r"^\s*(?:async\s+def|def|class)\s+\w+.*:\s*(?:#.*)?$")


def header_line(prompt: str) -> str:
    """The prompt's last line with non-whitespace content ("" when none)."""
    for line in reversed(prompt.split("\n")):
        if line.strip():
            return line
    return ""


def opens_block(prompt: str) -> bool:
    """The prompt ends with a `def` / `async def` / `class` header line (what `deepinfer generate`
    stops at the end of by default)."""
    return bool(_BLOCK_HEADER.match(header_line(prompt)))


def drop_unfinished_line(text: str) -> str:
    """text without its last line when that line has no newline yet (a completion cut by
    max_tokens): the evaluation's rule for a function that did not end in time."""
    cut = text.rfind("\n")
    return text[: cut + 1] if cut >= 0 else text


def drop_to_complete_lines(prompt: str, text: str) -> tuple[str, int]:
    """A completion cut by max_tokens, shortened to the longest prefix of whole lines after which
    `prompt + text` parses (an unfinished statement or a block header left without its body is
    dropped), or else `drop_unfinished_line(text)`; returns (text, lines dropped)."""
    import ast

    lines = text.split("\n")
    for n in range(len(lines) - 1, 0, -1):   # keep lines[:n], each with its newline
        kept = "\n".join(lines[:n]) + "\n"
        try:
            ast.parse(prompt + kept)
        except (SyntaxError, ValueError):
            continue
        return kept, len(lines) - n
    return drop_unfinished_line(text), 1 if "\n" in text else 0


class FunctionEndRule:
    """The block-end detector of one request: `find` is fed the text a window at a time (the
    StopStringMatcher protocol: `text[checked_upto:]` is new), `holdback` says what may still be cut."""

    def __init__(self, indent: int, at_line_start: bool = False):
        self.indent = indent              # indentation of the header line
        self._line_start = at_line_start  # reading a line's leading whitespace
        self._line_ws = 0                 # leading whitespace characters of the current line so far
        self._since_line_start = 0        # characters read since the current line began
        self._string: str | None = None   # None | the quote of an open '...' | '"""' / "'''" when triple
        self._comment = False
        self._escape = False
        self._quotes = 0                  # run of quote characters just read (outside strings)
        self._quote_char = ""
        self._closing = 0                 # run of closing quote characters inside a triple string

    @classmethod
    def for_prompt(cls, prompt: str) -> FunctionEndRule:
        line = header_line(prompt)
        return cls(len(line) - len(line.lstrip()), prompt.endswith("\n"))

    def find(self, text: str, checked_upto: int) -> StopMatch | None:
        """The block end among the new characters `text[checked_upto:]`, or None. The match starts
        where the ending line starts (possibly before the window: a negative offset) and ends at
        the character that decided it."""
        for i in range(checked_upto, len(text)):
            c = text[i]
            if self._line_start:
                if c == "\n" or (not c.isspace() and self._line_ws <= self.indent):
                    start = i - self._since_line_start
                    return StopMatch(text[max(0, start): i + 1], start, i + 1)
                if c.isspace():
                    self._line_ws += 1
                    self._since_line_start += 1
                    continue
                self._line_start = False
            self._since_line_start += 1
            if self._lex(c):
                self._line_start, self._line_ws, self._since_line_start = True, 0, 0
        return None

    def _lex(self, c: str) -> bool:
        """Advance the lexer by one character; True when it ends a code line (a newline outside a
        triple-quoted string)."""
        if self._quotes and c != self._quote_char:   # a run of quotes outside strings ends
            n, q, self._quotes = self._quotes, self._quote_char, 0
            while n >= 6:        # '""""""': an empty triple-quoted string
                n -= 6
            if n >= 3:           # an open triple quote, and the quotes after it inside the string
                self._string, self._closing = q * 3, n - 3
            elif n == 1:
                self._string = q
        if self._string is not None:
            if self._escape:
                self._escape = False
                return False
            if c == "\\":
                self._escape = True
                return False
            if len(self._string) == 1:
                if c == self._string or c == "\n":
                    self._string = None
                return c == "\n"
            if c == self._string[0]:
                self._closing += 1
                if self._closing == 3:
                    self._string, self._closing = None, 0
            else:
                self._closing = 0
            return False
        if self._comment:
            if c == "\n":
                self._comment = False
            return c == "\n"
        if c in "\"'":
            self._quote_char = c
            self._quotes += 1
            return False
        if c == "#":
            self._comment = True
        return c == "\n"

    def holdback(self, text: str) -> int:
        """Characters at the end that may still be cut: the current line, while it is all whitespace."""
        cut = text.rfind("\n")
        tail = text[cut + 1:]
        if (cut < 0 and not self._line_start) or tail.strip():
            return 0
        return len(tail)
