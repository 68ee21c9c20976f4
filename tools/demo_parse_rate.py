"""Parse rate of `make demo` (`deepinfer generate --prompt HEADER --max-tokens N --temperature 0`) over
20 function headers: before = `header + completion` uncut (what the CLI printed before it stopped at
the end of the function); after = what the CLI prints now (SamplingParams.stop_at_function_end, and on
max_tokens `function_end.drop_to_complete_lines`). Batched: greedy tokens do not depend on the batch.

    python tools/demo_parse_rate.py [max_tokens=64]
"""

from __future__ import annotations

import ast
import sys

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.function_end import drop_to_complete_lines

HEADERS = ["def fibonacci(n):", "def parse_args(argv):", "def is_prime(n):", "def read_file(path):",
           "def flatten(items):", "def merge_dicts(a, b):", "def main():", "def add(a, b):",
           "def factorial(n):", "def reverse_string(s):", "def count_words(text):", "def binary_search(arr, x):",
           "def mean(values):", "def to_json(obj):", "def get_logger(name):", "class Stack:",
           "def __init__(self, name):", "def clamp(x, lo, hi):", "def load_config(filename):", "def chunks(seq, n):"]


def parses(program: str) -> bool:
    try:
        ast.parse(program)
        return True
    except (SyntaxError, ValueError):
        return False


def main() -> int:
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    llm = LLM()
    before = llm.generate(HEADERS, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    after = llm.generate(HEADERS, SamplingParams(temperature=0, max_tokens=max_tokens, stop_at_function_end=True),
                         use_tqdm=False)
    num_before = num_after = 0
    for header, b, a in zip(HEADERS, before, after):
        text = drop_to_complete_lines(header, a.text)[0] if a.finish_reason == "length" else a.text
        ok_before, ok_after = parses(header + b.text), parses(header + text)
        num_before += ok_before
        num_after += ok_after
        print(f"{header:30s} before={ok_before!s:5} after={ok_after!s:5} {a.finish_reason} {len(a.token_ids)} tokens")
    print(f"parse rate over {len(HEADERS)} headers, {max_tokens} tokens: before {num_before}/{len(HEADERS)}, "
          f"after {num_after}/{len(HEADERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
