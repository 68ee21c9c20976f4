"""`deepinfer` command line: `deepinfer generate --prompt 'def f(x):'`, `deepinfer serve` (serving/cli.py).

One subcommand parser per command (`generate`; others add theirs in `build_parser`). Every
failure a user can cause (a bad flag value, a missing model path, no GPU for `--device cuda`, a
model that does not fit, a rejected request) ends in one line `error: ...` on stderr and exit
status 2; tracebacks are for bugs.

Code prompts: when the prompt's last line opens a `def` / `class` block, `generate` stops where
that block ends (`--function-end auto`, the default: SamplingParams.stop_at_function_end, the
default model's evaluation rule) and, when `--max-tokens` cuts the block short, drops the
unfinished lines at its end (an unfinished statement, a block header without its body; said on
stderr), so that the printed program is the function alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

EXIT_USAGE = 2   # argparse's status for bad usage; also every user-caused error here


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _json_schema(text: str) -> dict:
    """--json-schema: inline JSON, or @path to a file holding it."""
    source = text
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as err:
            raise argparse.ArgumentTypeError(f"cannot read {source[1:]!r}: {err.strerror}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from None
    if not isinstance(schema, (dict, bool)):
        raise argparse.ArgumentTypeError(f"a JSON schema is an object, got {type(schema).__name__}")
    return schema


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from deepinfer_engine import __version__
    parts = [f"deepinfer-engine {__version__}"]
    for dist in ("deepinfer-model", "deepinfer-kernels", "deepinfer-sched"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


class _VersionAction(argparse.Action):
    """--version without importing torch until asked."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-token-ids", type=_parse_ids, help="comma-separated prompt token ids")
    gen.add_argument("--model", default=None, help="HF-layout checkpoint dir (default: the embedded model)")
    gen.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA if present)")
    gen.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens at most")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop string (repeatable); the text is cut before it")
    gen.add_argument("--json-schema", type=_json_schema, default=None, metavar="JSON|@FILE",
                     help="constrain the output to this JSON schema (inline or @file)")
    gen.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="print each output token's logprob and its top-K alternatives")
    gen.add_argument("--function-end", choices=("auto", "on", "off"), default="auto",
                     help="stop where the prompt's def/class block ends (auto: when the prompt ends in one)")
    gen.add_argument("--show-ids", action="store_true", help="also print the output token ids")
    gen.add_argument("--data-parallel-size", type=int, default=1, help="DP ranks, one process each (docs/parallel.md)")
    gen.add_argument("--expert-parallel", action="store_true", help="partition the routed experts over the DP ranks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer: V4.1-architecture inference engine")
    parser.add_argument("--version", action=_VersionAction, help="print the package versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    from deepinfer_engine.serving.cli import add_serve_parser
    add_serve_parser(sub)
    return parser


_ALLOC = re.compile(r"tried to allocate (\d+) bytes")


def _error(message) -> int:
    text = str(message)
    alloc = _ALLOC.search(text)
    if alloc:   # torch's allocator message: "[enforce fail at alloc_cpu.cpp:127] ... you tried to allocate N bytes"
        text = f"the model does not fit in memory (an allocation of {int(alloc.group(1)) / 2**30:.1f} GiB failed)"
    first = text.strip().splitlines()
    print(f"error: {first[0] if first else text}", file=sys.stderr)
    return EXIT_USAGE


def _generate(args) -> int:
    from deepinfer_engine import LLM, SamplingParams
    from deepinfer_engine.errors import InvalidRequestError
    from deepinfer_engine.function_end import drop_to_complete_lines, opens_block
    from deepinfer_engine.structured_output import StructuredOutput

    function_end = args.function_end == "on" or (
        args.function_end == "auto" and args.prompt is not None and args.json_schema is None
        and opens_block(args.prompt))
    try:
        params = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens,
            seed=args.seed, stop=args.stop, logprobs=args.logprobs, stop_at_function_end=function_end,
            structured_output=None if args.json_schema is None else StructuredOutput.json_schema(args.json_schema))
    except InvalidRequestError as err:
        return _error(err)
    try:
        llm = LLM(args.model, device=args.device, max_model_len=args.max_model_len,
                  data_parallel_size=args.data_parallel_size, expert_parallel=args.expert_parallel)
    except (ValueError, RuntimeError, OSError, MemoryError) as err:   # bad path / device / fit: the user's setup
        return _error(err)
    if args.prompt is not None:
        out = llm.generate([args.prompt], params, use_tqdm=False)[0]
    else:
        out = llm.generate(prompt_token_ids=[args.prompt_token_ids], sampling_params=params, use_tqdm=False)[0]
    if out.error:
        return _error(out.error)
    prompt = args.prompt
    if prompt is None and llm.tokenizer is not None:   # show what the ids say
        prompt = llm.tokenizer.decode(args.prompt_token_ids, skip_special_tokens=False)
    text, note = out.text, ""
    if text is not None and function_end and out.finish_reason == "length":
        text, dropped = drop_to_complete_lines(prompt or "", text)
        note = f", cut by --max-tokens: the last {dropped} unfinished line(s) dropped" if dropped else ""
    if args.prompt is None:
        print("prompt token ids:", args.prompt_token_ids)
    if text is not None:
        shown = (prompt or "") + text
        sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")
    if text is None or args.show_ids:
        print("token ids:", out.token_ids)
    if args.logprobs is not None:
        _print_logprobs(llm, out)
    ended = ", at the end of the function" if function_end and out.finish_reason == "stop" and out.stop_str is not None \
        and out.stop_str not in args.stop else ""
    print(f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}{ended}{note}, "
          f"model={llm.engine.model_source}]", file=sys.stderr)
    return 0


def _print_logprobs(llm, out) -> None:
    def piece(t: int) -> str:
        return repr(llm.tokenizer.decode([t])) if llm.tokenizer is not None else str(t)
    for k, (t, lp) in enumerate(zip(out.token_ids, out.token_logprobs or [])):
        top = (out.top_logprobs or [{}] * len(out.token_ids))[k] if out.top_logprobs else {}
        alts = "  ".join(f"{piece(a)} {v:.3f}" for a, v in sorted(top.items(), key=lambda kv: -kv[1]))
        print(f"{k:4d} {piece(t):>16} {lp:9.4f}" + (f"   | {alts}" if alts else ""))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if args.command == "serve":
        return args.func(args)
    return _error(f"unknown command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
