"""TileLang builder of the warp-MMA sparse MLA decode kernel ("mma"; 16 heads, D 512; "auto" at decode).

Why: ``bulk`` dequantizes every 64-key block into a bf16 tile in shared memory that two wgmmas then
read; Nsight Compute counts 2,283 shared-memory wavefronts a block even without bank conflicts,
0.89 of the cycles 80% of copy bandwidth leaves a block on the H200 (2026-12-02). The removed
``regs`` kernel kept the tile out of shared memory but needed a 64-row wgmma operand per warpgroup,
so its two consumer warpgroups each carried their own copy of the code and stalled on instruction
fetch (the kernels README, design notes).

Here the 16 heads are the M of ``mma.sync.m16n8k16``, so no operand is padded and every operand is
a register: eight consumer warps split the 512 latent dims (64 each), convert their bytes to f16
once (times each key's group scale over the row's largest, ``kfac``), and use the same registers
for QK and (transposed with ``movmatrix``) for PV. The warps' partial scores meet once per 32 keys
in shared memory (4 KB a warp), where each warp runs the online softmax of two heads. All the
consumer code is one CUDA function that the eight warps share (``_cuda_mma_teams.py``;
``_cuda_mma.py`` for one team; their common steps in ``_cuda_mma_steps.py``), the stage tables
another (``_cuda_mma_prep.py``); TileLang lays out the buffers and barriers and runs the producers:

    producer warp 0:    block i + NST -> K8[s]  (after empty[s]; TMA bulk copies, bytes on full[s])
    producer warps 1-2: after full[s]: the stage's key factors (8 groups each), the row's running
                        scale exponent and -inf mask -> ready[s]
    consumer warps 0-7: after ready[s]: two halves of QK, softmax, PV -> empty[s]

The default consumer is the two-team one (``_cuda_mma_teams.py``): warps 0-3 take the first 32 keys
of every stage, warps 4-7 the last 32, each team with its own softmax, scale exponent and barriers.

Measured (H200, 2026-12-03; the README's benchmark command, CUDA graphs, L2
flushed, 132 rows x 16 heads), us against ``bulk`` in the same run: 179.3 vs 270.8 over KV blocks of
128 at 8,192 keys (75.3% of copy; the one-team consumer 193.4-197.6), 52.8 vs 74.7 at 2,048 (65.4%),
105.8 vs 123.9 over random slots, 17.4 vs 19.6 on the engine's packed layout. Per 32-key half a warp
issues ~260 instructions when no rescale is due. "auto" runs it for decode calls since 2026-12-03
(up to 16 heads at D 512, 1 to 256 rows, not batch-invariant: ``plan._mma_serves``); `mini`
decode end to end at batch 64, prompt 4,096, it changed nothing measurable (29,292 vs 29,298
tokens/s with "bulk", same run): attention is a small share of that step. Its steady state is the
SM's own pace (1.28-1.30 us a 64-key block at 1, 66 and 132 rows: 80.3-80.5% of copy at 132),
plus ~11 us a call at 132 rows (4.8 at one row; ``diag/sparse_mla_width_sweep.py --rows``): per-CTA
marks (``diag/sparse_mla_cta_marks.py``) show the first stage ready after 3.8-4.6 us (median; up to
8.7) and CTAs ending up to ~4 us after the median. The two-team build keeps 177 KB of shared memory
(the epilogue's hand-over over the stages' bytes); a fifth stage (``stages=5``, 215 KB) was slower.
With ``FAST_EXP`` (the bare ``ex2.approx.ftz`` in the softmax): 173.9 vs ``bulk``'s 271.7 us at
8,192 keys (77.7% of copy), 52.1 vs 74.5 at 2,048; ``diag/sparse_mla_mma_diag.py`` times the
consumer with one part compiled out (docs/benchmarks.md, 2026-12-03).

Precision: Q goes to f16 with a power-of-two scale per head (its largest element in [2^14, 2^15)),
K / V are f16 (``hw_cvt``: the hardware e4m3 -> f16 conversion; otherwise three integer operations
give the value times 2^-8) times 2^(s - C), s the key's group scale and C the row's running maximum
of every scale byte: exact while s >= C - 15; further below, f16 subnormals and, past C - 24, zero
(``_cuda_mma.py``; RMS-normalized latents keep a record's group scales within a few powers of two).
QK accumulates in fp32. With ``lazy_rescale`` (the default) a head's reference maximum moves only
when a score passes it by more than 8 (log2 units), so P <= 2^8 (exact in f16) and most halves skip
the accumulators' rescale; the result is the same softmax, referred to another maximum.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC
from deepinfer_kernels.tilelang._cuda_mma import MMA_SRC
from deepinfer_kernels.tilelang._cuda_mma_prep import MMA_PREP_SRC
from deepinfer_kernels.tilelang._cuda_mma_steps import MMA_STEPS_SRC
from deepinfer_kernels.tilelang._cuda_mma_teams import MMA_TEAMS_SRC
from deepinfer_kernels.tilelang._cuda_warp import WARP_SRC
from deepinfer_kernels.tilelang.sparse_mla.common import BLOCK_TOKENS, _record_bytes, one_row_kernel, row_dims
from deepinfer_kernels.tilelang.sparse_mla.producer import _bulk_macros, _issue_stream_macro

MMA_STAGES = 4            # FP8 stages of 64 keys (33 KB each)
MMA_CONSUMER_REGS = 232   # setmaxnreg: 256 consumers x 232 + 128 producers x 40 <= the launch's 384 x 168
MMA_PRODUCER_REGS = 40
HW_CVT = True             # the hardware e4m3 -> f16 conversion (else the integer one)
SCORE_STRIDE = 40         # row stride (floats / halves) of the partial scores and of P (_cuda_mma's SST)
PREP_WARPS = 2            # producer warps building the stage tables (8 scale groups each)
LAZY_RESCALE = True       # the softmax's reference maximum moves only by more than 2^8 (_cuda_mma's LAZY)
TEAMS = True              # two consumer teams, one per half of each stage (_cuda_mma_teams.py)
FAST_EXP = True           # the teams' softmax 2^x as the bare ex2.approx.ftz (_cuda_mma_teams.py's di_exp2)


def _build_mma(heads: int, d: int, split: bool, hw_cvt: bool = HW_CVT, timeline: bool = False,
               lazy_rescale: bool = LAZY_RESCALE, teams: bool = TEAMS, stages: int = MMA_STAGES,
               fast_exp: bool = FAST_EXP):
    """Warp-MMA decode kernel; same signature and dynamic shapes as ``_build_bulk`` (``common.one_row_kernel``)
    (one query row x up to 16 heads per CTA: more heads, a multiple of 16, take a CTA per 16, each
    reading the row's records; ``bps`` blocks per split). ``timeline`` (not split, 16 heads):
    clock64() marks of consumer thread 0 and the prep warp into the row's ``Opart[0, r]``
    viewed as int64 (``packages/deepinfer-kernels/diag/sparse_mla_decode_timeline.py mma``). The mark buffer goes in as
    ``Opart``'s base and the row's offset: an index ``Opart[0, r]`` would make TileLang guard the
    call with ``r < RP``, and the whole-row launch passes a one-row ``Opart``. ``teams``: the
    two-team consumer (``_cuda_mma_teams.py``; no timeline marks). ``stages``: FP8 stages in flight.
    ``fast_exp`` (teams): ``FAST_EXP``."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    H = heads
    HC = min(H, 16)                # heads of a CTA
    HG = H // HC                   # CTAs of a row
    NST = stages
    NG = d // 32
    assert (H <= 16 or H % 16 == 0) and d == 512 and REC % 16 == 0 and NG == 16, "mma: up to 16 heads or a multiple, D 512"
    assert not (timeline and H > 16), "timeline marks: one CTA a row"
    issue_stream = _issue_stream_macro(T, *_bulk_macros(T, d, 1)[:2], NST)
    assert not (timeline and split), "timeline marks go into Opart: whole rows only"
    assert not (timeline and teams), "timeline marks: the one-team consumer"
    hw, tl, lazy = ("true" if flag else "false" for flag in (hw_cvt, timeline, lazy_rescale))
    sp_ = "true" if split else "false"
    if teams:
        fx = "true" if fast_exp else "false"
        CONSUME = f"di_mma_teams_consumer<{REC}, {d}, {NST}, {HC}, {SCORE_STRIDE}, {sp_}, {hw}, {lazy}, {fx}>"
    else:
        CONSUME = f"di_mma_consumer<{REC}, {d}, {NST}, {HC}, {SCORE_STRIDE}, {sp_}, {hw}, {tl}, {lazy}>"
    PW = PREP_WARPS
    PREP = f"di_mma_prep<{REC}, {d}, {hw}, {tl}, {PW}, {'true' if teams else 'false'}>"
    FIN = 64 if teams else 16     # per head: the row's 1 / l (teams: each team's maximum and sum)
    CRUN = 2 if teams else 1      # running scale exponents (teams: one per half)

    R, W, S, NS, RP = dims = row_dims(T)

    @T.macro
    def body(Q, Pool, Idx, Out, Lse, Opart, Lpart, scale, bps):
        with T.Kernel(R * HG, NS, threads=384) as (bx, sp):
            r = bx // HG
            h0 = bx % HG * HC
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            T.import_source(BULK_COPY_SRC + WARP_SRC + MMA_PREP_SRC + MMA_STEPS_SRC
                            + (MMA_TEAMS_SRC if teams else MMA_SRC))
            K8 = T.alloc_shared((NST, BI, REC), T.uint8)
            ix_s = T.alloc_shared((NST, BI), T.int32)
            vm = T.alloc_shared((NST, BI), T.float32)
            kfac = T.alloc_shared((NST, NG, BI), T.uint32)
            beta = T.alloc_shared((NST, 2), T.float32)
            cabs = T.alloc_shared((NST, 2), T.int32)
            S_red = T.alloc_shared((2, 4 if teams else 8, 16, SCORE_STRIDE), T.float32)
            P_sm = T.alloc_shared((2, 16, SCORE_STRIDE), T.uint16)
            alpha_sm = T.alloc_shared((2, 16), T.float32)
            qsm = T.alloc_shared((16,), T.float32)
            fin_sm = T.alloc_shared((FIN,), T.float32)
            full = T.alloc_barrier(arrive_count=[1] * NST)
            ready = T.alloc_barrier(arrive_count=[32 * PW] * NST)
            empty = T.alloc_barrier(arrive_count=[8] * NST)
            tx = T.get_thread_binding()
            b0 = sp * bps
            nblk = T.alloc_var(T.int32)
            nblk = T.max(0, T.min(bps, T.ceildiv(W, BI) - b0))
            if tx < 256:
                T.set_max_nreg(MMA_CONSUMER_REGS, 1)
                # the row's output and lse: this split's partials when split, else the final ones
                T.call_extern("handle", CONSUME, T.access_ptr(K8[0, 0, 0], "r"), T.access_ptr(vm[0, 0], "r"),
                              T.access_ptr(kfac[0, 0, 0], "r"), T.access_ptr(beta[0, 0], "r"),
                              T.access_ptr(cabs[0, 0], "r"),
                              T.access_ptr(S_red[0, 0, 0, 0], "rw"), T.access_ptr(P_sm[0, 0, 0], "rw"),
                              T.access_ptr(alpha_sm[0, 0], "rw"), T.access_ptr(qsm[0], "rw"),
                              T.access_ptr(fin_sm[0], "rw"), T.access_ptr(ready[0], "rw"),
                              T.access_ptr(empty[0], "rw"), T.access_ptr(Q[r, h0, 0], "r"),
                              (T.access_ptr(Opart[sp, r, h0, 0], "w") if split
                               else T.access_ptr(Out[r, h0, 0], "w")),
                              (T.access_ptr(Lpart[sp, r, h0], "w") if split
                               else T.access_ptr(Lse[r, h0], "w")),
                              scale, tx, T.access_ptr(Opart[0, 0, 0, 0], "w"), r, W, bps)
            else:
                T.set_max_nreg(MMA_PRODUCER_REGS, 0)
                tp = tx - 256
                if tp < 32:
                    issue_stream(Idx, Pool, K8, ix_s, full, empty, r, W, b0, nblk, tp)
                elif tp < 32 * (1 + PW):
                    pw = tp // 32 - 1
                    lane = tp % 32
                    crun = T.alloc_local((CRUN,), T.int32)    # the row's running scale exponent(s)
                    for c in T.serial(CRUN):
                        crun[c] = 0
                    for i in T.serial(nblk):
                        s = i % NST
                        T.barrier_wait(full[s], (i // NST) & 1)
                        T.call_extern("handle", PREP, T.access_ptr(K8[s, 0, 0], "rw"), T.access_ptr(ix_s[s, 0], "r"),
                                      T.access_ptr(vm[s, 0], "w"), T.access_ptr(kfac[s, 0, 0], "w"),
                                      T.access_ptr(beta[s, 0], "w"), T.access_ptr(cabs[s, 0], "w"), crun.data, pw, lane,
                                      T.access_ptr(Opart[0, 0, 0, 0], "w"), r * H * d, i)
                        T.barrier_arrive(ready[s])

    return one_row_kernel(T, H, d, dims, body)
