"""Where the decode sparse MLA kernel's time goes (SM90, ``bulk``, 16 heads, D 512): variants of
``sparse_mla/bulk.py`` / ``sparse_mla/common.py`` with parts compiled out (text substitutions
of the builders' source, never merged, ``kernel_variants.py``), timed one after another in one
process on issue 5's decode cases. Prints, per case and variant, the median us, us per 64-key
block per CTA, the share of the copy bandwidth measured in the same run (unique record bytes, as
the kernel benchmark counts them), and the largest difference from the base kernel's output
(garbage for the variants that skip work).

    python packages/deepinfer-kernels/diag/sparse_mla_decode_diag.py                    # every variant
    python packages/deepinfer-kernels/diag/sparse_mla_decode_diag.py base,no_pv,no_dequant

Issue 5 asks for 80% of copy on this kernel (46.2% over KV blocks, H200 2026-12-01): the variants
say which part the time waits for.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_variants import ModuleEdit, compile_in_workers, compile_variant, load_variant, median_us  # noqa: E402

HEADS, D, ROWS, SLOTS = 16, 512, 132, 400_000
QK = "T.gemm(Kb[s, :, :], Q_s, acc_s, transpose_B=True)"
PV = "T.gemm(Kb[s, :, :], P_s, acc_o, transpose_A=True)"
SOFTMAX = "block_softmax(tx, S_sm, vm, s, P_s, alpha_s, st, scale)"
DEQUANT = "dequant_block(K8, ix_s, Kb, vm, s, tp, qv, bv, s)"
# the copies' barrier completes by one plain arrive instead of the bulk copies' bytes
ISSUE = re.compile(r"^( *)issue_block\(Pool, K8, ix_s, fp8_full, s, tp, ib, s \* \(RPL \+ 1\)\)$", re.M)
NO_COPY = r"\1if tp == 0:\n\1    T.barrier_arrive(fp8_full[s])"

# name -> (substitutions of sparse_mla/common.py (the consumer), of sparse_mla/bulk.py (the
# producers' loop), keyword arguments of _build_bulk)
VARIANTS: dict[str, tuple[list, list, dict]] = {
    "base": ([], [], {}),
    "no_qk": ([(QK, "pass")], [], {}),
    "no_pv": ([(PV, "pass")], [], {}),
    "no_softmax": ([(SOFTMAX, "pass")], [], {}),
    "no_dequant": ([], [(DEQUANT, "pass")], {}),
    "no_copy": ([], [(ISSUE, NO_COPY)], {}),
    "producers1": ([], [], {"producers": 1}),      # one dequantizing warpgroup instead of two
    "batch1": ([], [], {"load_batch": 1}),         # the dequantization's loads about chunk by chunk
    "batch4": ([], [], {"load_batch": 4}),
    # the online softmax's two token loops unrolled (their shared loads issued together)
    "softmax_unroll": ([("for k in T.serial(TOK):", "for k in T.unroll(TOK):")], [], {}),
    # one role alone: the consumer's work or the producers' work compiled out
    "idle_consumer": ([(QK, "pass"), (PV, "pass"), (SOFTMAX, "pass")], [], {}),
    "idle_producers": ([], [(DEQUANT, "pass"), (ISSUE, NO_COPY)], {}),
}


def edits(name: str) -> list[ModuleEdit]:
    consumer, producer, _ = VARIANTS[name]
    return [ModuleEdit("sparse_mla.common", tuple(consumer)), ModuleEdit("sparse_mla.bulk", tuple(producer))]


def variant_prim_func(name: str):
    """The variant's TileLang prim_func (no GPU needed): one row per CTA, no trim, no split."""
    kwargs = {"producers": 2, **VARIANTS[name][2]}
    return load_variant(edits(name), name)._build_bulk(HEADS, D, HEADS, False, trim=False, **kwargs)


@functools.cache        # each variant is timed on every case: compile once
def build(name: str):
    return compile_variant(variant_prim_func(name))


def cases(pool):
    from deepinfer_kernels import testing

    yield "kv_blocks_w2048", testing.make_sparse_mla_case(ROWS, HEADS, D, 2048, SLOTS, "cuda", pool=pool, paged=128, seed=1)
    yield "random_w2048", testing.make_sparse_mla_case(ROWS, HEADS, D, 2048, SLOTS, "cuda", pool=pool, distinct=True,
                                                       seed=1)
    yield "engine_packed_w384", testing.make_engine_decode_case(ROWS, HEADS, D, 128, 16, 16, 4, SLOTS, "cuda", pool=pool,
                                                                seed=5, packed=True)


def run_all(steps) -> None:
    for step in steps:
        step()


def copy_tb_s() -> float:
    """Device copy bandwidth of this run (read + write of 512 MB), TB/s."""
    import torch

    src = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_us(lambda: dst.copy_(src)) * 1e-6) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="?", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    names = ap.parse_args().variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    compile_in_workers(build, names)

    import torch

    from deepinfer_kernels import testing
    from deepinfer_kernels.tilelang.sparse_mla import plan
    from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E

    pool = testing.make_pool(SLOTS, D, "cuda", seed=0)
    copy = copy_tb_s()
    print(f"copy bandwidth {copy:.2f} TB/s", flush=True)
    for case_name, c in cases(pool):
        rows, width = c.indices.shape
        bps = plan(rows, HEADS, D, width, 132, 1, "bulk")["bps"]
        idx = c.indices.to(torch.int32).contiguous()
        out = torch.empty(rows, HEADS, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(rows, HEADS, dtype=torch.float32, device="cuda")
        dummy_o = torch.empty(1, 1, HEADS, D, dtype=torch.float32, device="cuda")
        dummy_l = torch.empty(1, 1, HEADS, dtype=torch.float32, device="cuda")
        scale = float(c.sm_scale) * LOG2E
        reference = None
        for name in names:
            kernel = build(name)
            out.zero_()
            us = median_us(functools.partial(kernel, c.q, pool, idx, out, lse, dummy_o, dummy_l, scale, bps))
            if reference is None:
                reference = out.clone()
            diff = (out.float() - reference.float()).abs().max().item()
            share = c.unique_bytes() / (us * 1e-6) / (copy * 1e12)
            print(f"{case_name} {name} {us:.1f} us, {us / bps:.2f} us/block, {share:.1%} of copy, "
                  f"max|diff| vs {names[0]} {diff:.3g}", flush=True)


if __name__ == "__main__":
    main()
