"""Profile one engine step with torch.profiler: kernels (CUDA) by device time and by count, torch ops
by self time, and the step's wall time beside its device time: the tool that finds ops running
their torch reference on the GPU.

    python packages/deepinfer-engine/diag/profile_step.py --model preset:mini --mode prefill --batch 64 --prompt-len 512
    python packages/deepinfer-engine/diag/profile_step.py --model preset:mini --mode decode --batch 1    # eager decode step

Decode steps are profiled eagerly (no CUDA graphs, no ZOS) so that every kernel is attributed.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from _cli import model_run_parser


def main() -> None:
    from deepinfer_engine import LLM, SamplingParams

    ap = model_run_parser(__doc__, batch=64)
    ap.add_argument("--mode", choices=("prefill", "decode"), default="prefill")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()

    llm = LLM(None if args.model == "default" else args.model, device=args.device, block_size=128,
              max_num_seqs=args.batch, max_model_len=max(1024, args.prompt_len + 256),
              max_num_batched_tokens=args.max_num_batched_tokens, num_speculative_tokens=args.nextn,
              enable_mtp_varlen=False, cuda_graphs=False, zero_overhead_scheduling=False, compile_decode=False,
              enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=1 if args.mode == "prefill" else 200, ignore_eos=True)
    rng = np.random.default_rng(0)

    def add_batch() -> None:
        for _ in range(args.batch):
            engine.add_request(prompt_token_ids=rng.integers(10, engine.vocab_size, size=args.prompt_len).tolist(),
                               params=params)

    def sync() -> None:
        if engine.device.type == "cuda":
            torch.cuda.synchronize()

    add_batch()
    warm = 6 if args.mode == "prefill" else 0
    for _ in range(warm):   # compile the kernels of this step's shapes first
        if not engine.has_unfinished():
            add_batch()
        engine.step()
    while args.mode == "decode" and engine.stats.num_decode_steps < 5:
        engine.step()
    if not engine.has_unfinished():
        add_batch()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        engine.step()
        sync()
        wall_ms = (time.perf_counter() - start) * 1e3
    kernels: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:100]]
            k[0] += 1
            k[1] += e.device_time_total
    count, device_us = sum(v[0] for v in kernels.values()), sum(v[1] for v in kernels.values())
    print(f"== {args.model} {args.mode} batch {args.batch} prompt {args.prompt_len}: {count} kernels, "
          f"{device_us / 1e3:.3f} ms device, {wall_ms:.2f} ms wall (profiled)")
    if kernels:
        for title, key in (("by device time", lambda kv: -kv[1][1]), ("by count", lambda kv: -kv[1][0])):
            print(f"-- kernels {title}")
            for name, (n, t) in sorted(kernels.items(), key=key)[: args.top]:
                print(f"{n:6d} {t / 1e3:9.3f} ms  {name}")
    sort = "self_cuda_time_total" if kernels else "self_cpu_time_total"
    print(f"-- torch ops by {sort}")
    print(prof.key_averages().table(sort_by=sort, row_limit=args.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
