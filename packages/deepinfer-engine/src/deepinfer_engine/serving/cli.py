"""`deepinfer serve [MODEL] --host --port ...`: the OpenAI-compatible server on uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

DEFAULT_MODEL_NAME = "deepinfer-default"


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API (completions, chat, models, health, metrics)")
    p.add_argument("model", nargs="?", default=None, help="HF-layout checkpoint dir (default: the embedded model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the `model` clients name (default: the dir name)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA if present)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--num-speculative-tokens", type=int, default=None)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-parallel-size", type=int, default=1, help="DP ranks, one process each (docs/parallel.md)")
    p.add_argument("--expert-parallel", action="store_true", help="partition the routed experts over the DP ranks")
    p.add_argument("--default-max-tokens", type=int, default=256, help="output limit when a request sets none")
    p.add_argument("--log-interval", type=float, default=10.0, help="seconds between metric log lines (0: off)")
    p.add_argument("--stuck-after", type=float, default=120.0, help="/health fails when a step runs longer")
    p.add_argument("--api-workers", type=int, default=None,
                   help="HTTP worker processes over one engine process (default: 4 on CUDA with >= 8 CPUs, else 1: "
                        "the app runs in the engine's process)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run_serve)


def engine_args(args) -> dict:
    """EngineConfig fields from the parsed arguments."""
    return dict(model=args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                num_speculative_tokens=args.num_speculative_tokens,
                enable_prefix_caching=not args.no_prefix_caching, cuda_graphs=not args.no_cuda_graphs, seed=args.seed)


def build_engine(args):
    """The engine the server steps: what `LLM` chooses (one LLMEngine, or the DP front end over one
    process per rank)."""
    from deepinfer_engine.llm import LLM
    try:
        return LLM(data_parallel_size=args.data_parallel_size, expert_parallel=args.expert_parallel,
                   **engine_args(args)).engine
    except ValueError as err:   # a bad flag: one line, not a traceback
        raise SystemExit(f"deepinfer serve: {err}") from None


def build_loop(args):
    """(AsyncLLM, ServingMetrics) for the parsed arguments (the engine is loaded here)."""
    from deepinfer_engine.serving.async_llm import AsyncLLM
    from deepinfer_engine.serving.metrics import ServingMetrics

    metrics = ServingMetrics(log_interval_s=args.log_interval)
    return AsyncLLM(build_engine(args), stuck_after_s=args.stuck_after, observer=metrics), metrics


def served_name(args) -> str:
    return args.served_model_name or (Path(args.model).name if args.model else DEFAULT_MODEL_NAME)


def api_workers(args) -> int:
    """--api-workers, or its default: several HTTP processes where the device outruns one."""
    if args.api_workers is not None:
        if args.api_workers < 1:
            raise SystemExit(f"deepinfer serve: --api-workers: must be >= 1, got {args.api_workers}")
        return args.api_workers
    from deepinfer_engine.model_loader import resolve_device
    try:
        device_type = resolve_device(args.device).type
    except ValueError as err:
        raise SystemExit(f"deepinfer serve: {err}") from None
    return 4 if device_type == "cuda" and (os.cpu_count() or 1) >= 8 else 1


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from deepinfer_engine.serving.chat_template import load_chat_template
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = api_workers(args)   # a bad value fails before the model loads
    llm, metrics = build_loop(args)
    template = load_chat_template(args.model)
    served = dict(host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    try:
        if workers == 1:   # the app in this process
            from deepinfer_engine.serving.app import build_app, make_state
            uvicorn.run(build_app(make_state(llm, served_name(args), template, metrics, args.default_max_tokens)),
                        **served)
        else:   # N HTTP processes on one socket (uvicorn's supervisor), each linked to this engine
            from deepinfer_engine.serving.engine_link import ServerInfo
            from deepinfer_engine.serving.worker_hub import serve_api_workers
            engine = llm.engine
            info = ServerInfo(served_name(args), template, engine.tokenizer, engine.vocab_size, engine.max_model_len,
                              args.default_max_tokens)
            serve_api_workers(llm, metrics, info, workers, **served)
    finally:
        llm.shutdown()
        if hasattr(llm.engine, "shutdown"):   # the DP front end's rank processes
            llm.engine.shutdown()
    return 0
