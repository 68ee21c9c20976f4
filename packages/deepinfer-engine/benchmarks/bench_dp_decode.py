"""Decode tokens/s per GPU: one GPU against DP N + EP N in the same call (issue 49, acceptance 4).

    python packages/deepinfer-engine/benchmarks/bench_dp_decode.py --model preset:mini --batch 64 --dp 2

Each configuration generates `batch` requests per rank (random 32-token prompts, greedy,
ignore_eos) twice: `--tokens` new tokens and 1 new token; decode tokens/s = the difference in
tokens over the difference in wall time (prefill and start-up cancel), per GPU. `--profile DIR`
makes every DP rank record a torch profile of its steps (DEEPINFER_DP_PROFILE_DIR, worker.py)
and prints the share of device time in NCCL kernels (the communication share of the step).
One JSON line per configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def _decode_rate(llm, num_requests: int, tokens: int) -> float:
    from deepinfer_engine import SamplingParams
    prompts = np.random.default_rng(0).integers(10, 8000, size=(num_requests, 32)).tolist()

    def run(n: int) -> float:
        t = time.perf_counter()
        llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=n,
                                                                              ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t

    run(4)                                           # warm-up (kernel builds, allocator)
    return num_requests * (tokens - 1) / (run(tokens) - run(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="preset:mini")
    ap.add_argument("--batch", type=int, default=64, help="requests per rank")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--nextn", type=int, default=0)
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    from deepinfer_engine import LLM
    common = {"num_speculative_tokens": args.nextn, "max_num_seqs": args.batch, "max_model_len": 512}
    one = LLM(args.model, **common)
    rate1 = _decode_rate(one, args.batch, args.tokens)
    print(json.dumps({"config": "1 GPU", "model": args.model, "batch_per_gpu": args.batch,
                      "decode_tokens_per_s_per_gpu": round(rate1, 1)}), flush=True)
    del one
    if args.profile:
        os.environ["DEEPINFER_DP_PROFILE_DIR"] = args.profile
    dp = LLM(args.model, data_parallel_size=args.dp, expert_parallel=True, **common)
    rate = _decode_rate(dp, args.batch * args.dp, args.tokens) / args.dp
    print(json.dumps({"config": f"DP{args.dp}+EP{args.dp}", "model": args.model, "batch_per_gpu": args.batch,
                      "decode_tokens_per_s_per_gpu": round(rate, 1), "vs_1_gpu": round(rate / rate1, 3),
                      "moe_lb": dp.engine.moe_lb}), flush=True)
    dp.engine.shutdown()
    if args.profile:
        for name in sorted(os.listdir(args.profile)):
            if name.endswith(".json"):
                print(json.dumps({"profile": name, **json.load(open(os.path.join(args.profile, name)))}))


if __name__ == "__main__":
    main()
