"""Where the quad sparse MLA kernel's time goes (SM90): variants of ``sparse_mla_quads.py`` with
parts compiled out by text substitutions of the builder's source (never merged), timed beside the
pair kernel on `mini`'s prefill rows and on long lists (4 rows sharing 1,024 paged keys: the steady
state per block). Prints, per case and kernel, the median us, us per 64-key block per SM, and the
largest difference from the pair kernel's output (garbage for the variants, which skip work).

    python packages/deepinfer-kernels/diag/sparse_mla_quads_diag.py                   # every variant
    python packages/deepinfer-kernels/diag/sparse_mla_quads_diag.py base,no_out       # some

Found the 2026-12-01 code-generation pitfalls (TILELANG.md): without the query load or the output the kernel took
~64% of its time, far more than those parts' bytes.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_variants import (  # noqa: E402
    ModuleEdit,
    compile_in_workers,
    compile_variant,
    edited_source,
    load_variant,
    median_us,
)

QK = "T.gemm(Q_s, Kb[s, :, :], acc_s, transpose_B=True)"
PV = "T.gemm(p_f, Kb[s, :, half * DH:(half + 1) * DH], acc_o)"
ISSUE = re.compile(r"^( *)issue_block\(Pool, K8, meta, fp8_full, 0, tp, ib, 0\)$", re.M)

# name -> (substitutions of the source, keyword arguments of _build_quads)
VARIANTS: dict[str, tuple[list, dict]] = {
    "base": ([], {}),
    "qpc1": ([], {"qpc": 1}),
    "qpc4": ([], {"qpc": 4, "max_blocks": 14}),
    "no_qk": ([(QK, "pass")], {}),
    "no_pv": ([(PV, "pass")], {}),
    "no_qload": ([("for it in T.serial(QCHUNKS):", "for it in T.serial(1):")], {}),
    "no_out": ([("if blk == nbv - 1:", "if blk == nbv + 1000:")], {}),
    "no_dequant": ([("dequant_block(K8, meta, Kb, meta, 0, tp, qv, bv, kst)", "pass")], {}),
    # the copies' barrier completes by one plain arrive instead of the bulk copies' bytes
    "no_copy": ([(ISSUE, r"\1if tp == 0:\n\1    T.barrier_arrive(fp8_full[0])")], {}),
    "batch1": ([], {"load_batch": 1}),               # the dequantization's loads about chunk by chunk
    "batch8": ([], {"load_batch": 8}),               # spills in the producers' 72 registers
}


def edits(name: str) -> list[ModuleEdit]:
    return [ModuleEdit("sparse_mla.quads", tuple(VARIANTS[name][0]))]


def variant_source(name: str) -> str:
    return edited_source(edits(name)[0], name)


def variant_prim_func(name: str):
    """The variant's TileLang prim_func (no GPU needed)."""
    return load_variant(edits(name), name)._build_quads(512, **VARIANTS[name][1])


@functools.cache        # each variant is timed on both cases: compile once
def build(name: str):
    return compile_variant(variant_prim_func(name))


def cases(pool, slots: int):
    import torch

    from deepinfer_kernels import testing

    c = testing.make_prefill_case(8192, 16, 512, 128, 16, 16, slots, "cuda", pool=pool, seed=6, prompt_len=512,
                                  paged=128)
    yield "mini_prefill", c.q, c.indices
    g = torch.Generator().manual_seed(1)
    blocks = torch.stack([torch.randperm(slots // 128, generator=g)[:8] for _ in range(2048)])
    keys = (blocks.unsqueeze(2) * 128 + torch.arange(128)).reshape(2048, 1024)
    yield "long_1024", c.q, keys.repeat_interleave(4, dim=0).to(torch.int32).cuda()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="?", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    names = ap.parse_args().variants.split(",")
    compile_in_workers(build, names)

    import torch

    from deepinfer_kernels.ops.shared_keys import shared_key_lists
    from deepinfer_kernels import testing
    from deepinfer_kernels.tilelang.shared_keys import MAX_WIDTH, shared_key_lists_tilelang
    from deepinfer_kernels.tilelang.sparse_mla import get_groups_kernel
    from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E

    slots = 1 << 20
    pool = testing.make_pool(slots, 512, "cuda", 0)
    scale = LOG2E / math.sqrt(512)
    pairs = get_groups_kernel(16, 512)
    for case, q, idx in cases(pool, slots):
        rows = idx.shape[0]
        out = torch.empty(rows, 16, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(rows, 16, dtype=torch.float32, device="cuda")
        lists = shared_key_lists_tilelang if idx.shape[1] <= MAX_WIDTH else (
            lambda ix, n: tuple(t.contiguous() for t in shared_key_lists(ix, group_rows=n)))
        keys4, counts4 = lists(idx, 4)
        keys2, counts2 = lists(idx, 2)
        blocks4 = int(torch.ceil(counts4.float() / 64).sum())
        blocks2 = int(torch.ceil(counts2.float() / 64).sum())
        us = median_us(lambda: pairs(q, pool, keys2, counts2, out, lse, scale))     # noqa: B023 (called here)
        reference = out.clone()
        print(f"{case} pairs {us:.1f} us, blocks {blocks2}, us/block/SM {us / (blocks2 / 132):.2f}", flush=True)
        for name in names:
            if case == "long_1024" and name == "qpc4":
                continue          # its 14 blocks per quad would cut the 16-block lists
            kernel = build(name)
            out.zero_()
            us = median_us(lambda: kernel(q, pool, keys4, counts4, out, lse, scale))  # noqa: B023 (called here)
            diff = (out.float() - reference.float()).abs().max().item()
            print(f"{case} quads-{name} {us:.1f} us, blocks {blocks4}, us/block/SM {us / (blocks4 / 132):.2f}, "
                  f"max|diff| vs pairs {diff:.3g}", flush=True)


if __name__ == "__main__":
    main()
