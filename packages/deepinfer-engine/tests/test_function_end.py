"""stop_at_function_end: the evaluation's rule (tools/default_model/evaluation.py,
cut_completion_code_blank) as a text stop, fed a token at a time."""

from __future__ import annotations

import random

import pytest

from deepinfer_engine.function_end import FunctionEndRule, drop_to_complete_lines, drop_unfinished_line, opens_block
from deepinfer_engine.stop_strings import StopStringMatcher


def _cut(header: str, completion: str, sizes) -> str | None:
    """Feed the completion in pieces as RequestState.push_text does; the kept text, or None."""
    matcher = StopStringMatcher([], FunctionEndRule.for_prompt(header))
    text, checked, pos = "", 0, 0
    while pos < len(completion):
        piece = completion[pos: pos + next(sizes)]
        pos += len(piece)
        text += piece
        lo = max(0, checked - matcher.max_len + 1)
        m = matcher.find(text[lo:], checked - lo)
        checked = len(text)
        if m is not None:
            return text[: m.start + lo]
    return None


CASES = [
    ("def f(n):", "\n    return n\n\nprint(f(1))", "\n    return n\n"),
    ("def f(n):", "\n    x = 1\n    return x\ndef g():\n", "\n    x = 1\n    return x\n"),
    ("def f(n):", '\n    """Doc.\n\n    More.\n    """\n    return n\n\n', '\n    """Doc.\n\n    More.\n    """\n    return n\n'),
    ("    def m(self):", "\n        return 1\n    def n(self):", "\n        return 1\n"),
    ("def f(n):", "\n    s = '#'  # \"\"\" not a string\n\nx", "\n    s = '#'  # \"\"\" not a string\n"),
    ("def f(n):", '\n    s = """\n\n"""\n    return s\n  \nx', '\n    s = """\n\n"""\n    return s\n'),
    ("class A:", "\n    x = 1\n\n    y = 2", "\n    x = 1\n"),
    ("def f(n):\n", "    return n\nz = 1", "    return n\n"),   # the prompt ends with its newline
    ("def f(n):", "\n    return n", None),                        # not ended yet
]


@pytest.mark.parametrize("header, completion, kept", CASES)
def test_cut_at_the_end_of_the_block_in_any_token_split(header, completion, kept):
    rng = random.Random(0)
    for _ in range(20):
        sizes = iter(lambda: rng.randint(1, 5), None)
        assert _cut(header, completion, sizes) == kept


def test_holdback_keeps_a_maybe_blank_line_back():
    rule = FunctionEndRule.for_prompt("def f():")
    assert rule.holdback("\n    return 1\n   ") == 3 and rule.holdback("\n    return 1") == 0


def test_helpers():
    assert opens_block("import os\n\ndef fibonacci(n):") and opens_block("class Stack:") and opens_block("  async def f(x):  ")
    assert not opens_block("import os") and not opens_block("x = {'a': 1}")
    assert drop_unfinished_line("\n    a = 1\n    b = fo") == "\n    a = 1\n"


def test_cut_by_max_tokens_keeps_the_lines_that_parse():
    text = "\n    if x:\n        return 1\n    if x is None:\n        y = fo"
    assert drop_to_complete_lines("def f(x):", text) == ("\n    if x:\n        return 1\n", 2)
    assert drop_to_complete_lines("def f(x):", '\n    """Doc\n\n    more') == ('\n    """Doc\n\n', 1)
