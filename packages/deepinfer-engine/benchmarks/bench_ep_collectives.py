"""EP dispatch/combine collectives at decode sizes, NCCL: all-to-all vs all-gather + reduce-scatter.

    torchrun --nproc-per-node 2 packages/deepinfer-engine/benchmarks/bench_ep_collectives.py --hidden 3072

Per rows-per-rank R (decode: batch x (1 + nextn)), top-k, hidden H, bf16:
  all_gather + reduce_scatter (what ep_comm.py does): gathers R x H per rank, reduce-scatters ep*R x H
  all_to_all: each rank sends R x k x H / ep to every rank (uniform routing) and gets as much back
Prints one JSON line per size: median ms of each, and the all-to-all bus bandwidth (GB/s) that
docs/parallel.md's model assumes (replace its NVLink assumption with this figure).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from deepinfer_kernels.tilelang.timing import cuda_time_us


def _time_ms(fn, iters: int) -> float:
    """Median device time of ``fn()`` in milliseconds (CUDA events, L2 left as it is)."""
    return cuda_time_us(fn, reps=iters, flush_l2=False)["median_us"] * 1e-3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--rows", default="1,8,64,256,1024,4096")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, ep = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    h, k = args.hidden, args.top_k
    for rows in (int(x) for x in args.rows.split(",")):
        x = torch.randn(rows, h, device="cuda", dtype=torch.bfloat16)
        gathered = torch.empty(ep * rows, h, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)

        def ag_rs():
            dist.all_gather_into_tensor(gathered, x)
            dist.reduce_scatter_tensor(out, gathered)

        pairs = max(ep, rows * k // ep * ep)        # uniform routing: rows*k pairs, 1/ep to each rank
        send = torch.randn(pairs, h, device="cuda", dtype=torch.bfloat16)
        recv = torch.empty_like(send)

        def a2a():
            dist.all_to_all_single(recv, send)      # dispatch
            dist.all_to_all_single(send, recv)      # combine

        t_agrs, t_a2a = _time_ms(ag_rs, args.iters), _time_ms(a2a, args.iters)
        a2a_bytes = 2 * pairs * h * 2 * (ep - 1) / ep   # bytes leaving each rank, both directions of the pair
        if rank == 0:
            print(json.dumps({"ep": ep, "rows_per_rank": rows, "hidden": h, "top_k": k,
                              "allgather_reducescatter_ms": round(t_agrs, 4), "all_to_all_ms": round(t_a2a, 4),
                              "all_to_all_GBps_per_rank": round(a2a_bytes / (t_a2a * 1e-3) / 1e9, 1)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
