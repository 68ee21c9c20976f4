"""The engine and prompts of tools/benchmark.py's rows (decode, and prefill in bench/prefill.py)."""

from __future__ import annotations

import gc

import numpy as np
import torch


def build_engine(args, **overrides):
    from deepinfer_engine import LLM

    kw = dict(device=args.device, block_size=args.block_size, max_num_seqs=max(args.max_num_seqs, 1),
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              num_speculative_tokens=args.nextn, enable_mtp_varlen=args.varlen, enable_prefix_caching=False)
    kw.update(overrides)
    return LLM(None if args.model == "default" else args.model, **kw).engine


def make_prompts(n: int, length: int, vocab: int, seed: int, code: bool = False) -> list[list[int]]:
    if code:  # held-out stdlib function headers with their context (what the default model writes)
        return code_prompts(n, length)
    rng = np.random.default_rng(seed)
    return rng.integers(10, vocab, size=(n, length)).tolist()


def code_prompts(n: int, length: int) -> list[list[int]]:
    from default_model.data import load_corpus
    from default_model.evaluation import function_prompts
    from tokenizers import Tokenizer

    corpus = load_corpus()
    tok = Tokenizer.from_file(str(corpus.tokenizer_path))
    funcs = function_prompts(corpus.held_out, n=max(n, 100))
    ids = [tok.encode(f["context"] + f["header"], add_special_tokens=False).ids[-length:] for f in funcs]
    return [ids[i % len(ids)] for i in range(n)]


def free_device_memory() -> None:
    """After the caller dropped its engine: free its KV pool and graphs before the next engine
    sizes its pool from free memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
