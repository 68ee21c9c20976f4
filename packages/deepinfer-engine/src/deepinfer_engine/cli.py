"""`deepinfer` command line: `deepinfer generate --prompt 'def f(x):'`."""

from __future__ import annotations

import argparse
import sys


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-token-ids: expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer: V4.1-architecture inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-token-ids", type=_parse_ids, help="comma-separated prompt token ids")
    gen.add_argument("--model", default=None, help="HF-layout checkpoint dir (default: the embedded model)")
    gen.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA if present)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--show-ids", action="store_true", help="also print the output token ids")
    gen.add_argument("--data-parallel-size", type=int, default=1, help="DP ranks, one process each (docs/parallel.md)")
    gen.add_argument("--expert-parallel", action="store_true", help="partition the routed experts over the DP ranks")
    from deepinfer_engine.serving.cli import add_serve_parser
    add_serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return args.func(args)
    from deepinfer_engine import LLM, SamplingParams
    from deepinfer_engine.errors import InvalidRequestError

    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, seed=args.seed)
    except InvalidRequestError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    llm = LLM(args.model, device=args.device, data_parallel_size=args.data_parallel_size,
              expert_parallel=args.expert_parallel)
    if args.prompt is not None:
        out = llm.generate([args.prompt], params, use_tqdm=False)[0]
    else:
        out = llm.generate(prompt_token_ids=[args.prompt_token_ids], sampling_params=params, use_tqdm=False)[0]
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 2
    if out.text is not None:
        print((args.prompt or "") + out.text)
    if out.text is None or args.show_ids:
        print("token ids:", out.token_ids)
    print(f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}, model={llm.engine.model_source}]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
