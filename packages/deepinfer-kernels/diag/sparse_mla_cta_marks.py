"""Per-CTA time marks of the warp-MMA sparse MLA decode kernel (two-team consumer, whole rows, 16 heads,
D 512, KV blocks of 128): where a call's time beyond the steady state goes.

Each CTA's thread 0 reads %globaltimer when the consumer starts, when its first stage is ready and when
its outputs are written (the marks go into the unused split buffer ``Opart``). Per width it prints, over
the CTAs (min / median / max, us from the first CTA's start): the start skew, the first stage's wait
(the pipeline fill: every CTA asks for its first ``stages`` blocks at once), the first-ready-to-end
time (the steady state) and the end (the call's tail), with the correlation of first-ready and end.

    python packages/deepinfer-kernels/diag/sparse_mla_cta_marks.py --widths 2048,8192 --stages 4,5 --reps 4

The marks add three stores a CTA; ``%globaltimer`` ticks every 256 ns on the H200 here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sparse_mla_decode_case import HEADS, ROWS, D, make_decode_case  # noqa: E402

MARK_FN = r'''
__device__ __forceinline__ void di_gt_mark(void* buf, int row, int e) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  reinterpret_cast<unsigned long long*>(buf)[row * 4 + e] = t;
}
'''


def marked_teams_source(src: str) -> str:
    """``_cuda_mma_teams.MMA_TEAMS_SRC`` with the three marks (consumer start, first stage ready, outputs
    written) into the mark buffer the consumer already receives; fails loudly when an anchor moved."""
    edits = [
        ("#define DI_MMA_TEAMS_SRC\n", "#define DI_MMA_TEAMS_SRC\n" + MARK_FN),
        ("void* /*mark_buf*/, int /*mark_row*/", "void* mark_buf, int mark_row"),
        ("  const int nblk = di_mma_block_count(keys, bps);\n",
         "  const int nblk = di_mma_block_count(keys, bps);\n  if (tx == 0) di_gt_mark(mark_buf, mark_row, 0);\n"),
        ("  if (nblk > 0) di_mbar_wait_s(a_rdy, 0);\n",
         "  if (nblk > 0) di_mbar_wait_s(a_rdy, 0);\n  if (tx == 0) di_gt_mark(mark_buf, mark_row, 1);\n"),
    ]
    for old, new in edits:
        if src.count(old) != 1:
            raise RuntimeError(f"marks: anchor {old.strip()!r} not found once in MMA_TEAMS_SRC")
        src = src.replace(old, new)
    end = src.rindex("}\n#endif")
    return src[:end] + "  __syncwarp();\n  if (tx == 0) di_gt_mark(mark_buf, mark_row, 2);\n" + src[end:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--widths", default="2048,8192", help="keys per row, comma-separated")
    p.add_argument("--stages", default="4", help="FP8 stages in flight, comma-separated builds")
    p.add_argument("--reps", type=int, default=4)
    args = p.parse_args(argv)

    import tilelang
    import torch

    import deepinfer_kernels.tilelang.sparse_mla.mma as M
    from deepinfer_kernels import testing as T
    from deepinfer_kernels.tilelang._common import TARGET
    from deepinfer_kernels.tilelang.sparse_mla import plan
    from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E, NO_AUTO_SYNC

    M.MMA_TEAMS_SRC = marked_teams_source(M.MMA_TEAMS_SRC)   # read by _build_mma at build time
    stages = [int(s) for s in args.stages.split(",")]
    kernels = {n: tilelang.compile(M._build_mma(HEADS, D, False, stages=n), target=TARGET, pass_configs=NO_AUTO_SYNC)
               for n in stages}
    if not torch.cuda.is_available():
        print(f"compiled {len(kernels)} marked build(s); running them needs CUDA")
        return
    rows, widths = args.rows, [int(w) for w in args.widths.split(",")]
    slots = rows * max(widths) + 4096
    pool = T.make_pool(slots, D, "cuda", seed=0)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")

    def spread(x: torch.Tensor) -> str:
        return f"{x.min().item():6.2f} / {x.median().item():6.2f} / {x.max().item():6.2f}"

    print("us, min / median / max over the CTAs; times from the first CTA's start")
    for width in widths:
        c = make_decode_case(width, "paged128", slots, pool, rows=rows)
        out = torch.empty(rows, HEADS, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(rows, HEADS, dtype=torch.float32, device="cuda")
        marks = torch.zeros(1, 1, HEADS, D, dtype=torch.float32, device="cuda")   # Opart: rows x 4 int64 marks
        lpart = torch.empty(1, 1, HEADS, dtype=torch.float32, device="cuda")
        bps = plan(rows, HEADS, D, width, 132, 1, "mma")["bps"]            # whole rows, as the launcher sizes them
        for n, kernel in kernels.items():
            for rep in range(args.reps):
                flush.zero_()
                kernel(c.q, c.pool, c.indices.int(), out, lse, marks, lpart, float(c.sm_scale) * LOG2E, bps)
                torch.cuda.synchronize()
                m = marks.view(torch.int64).view(-1)[: rows * 4].view(rows, 4)[:, :3].double() / 1e3
                start, ready, end = (m[:, k] - m[:, 0].min() for k in range(3))
                corr = torch.corrcoef(torch.stack([ready, end]))[0, 1].item()
                print(f"w{width} stages {n} rep {rep}: start {spread(start)} | first ready {spread(ready - start)} | "
                      f"ready -> end {spread(end - ready)} | end {spread(end)} | corr(ready, end) {corr:4.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
