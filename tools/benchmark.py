"""End-to-end throughput benchmark of the engine (SPEC §7 methodology), optionally beside the HF peer.

    python tools/benchmark.py --model preset:mini --device cuda --result-jsonl out.jsonl \
        --decode-batch-sizes 1,64 --prompt-len 512 --prefill-batch 64 --peer

Decode: prompts of --prompt-len random tokens, greedy, EOS ignored; after the prefill, skip
--warmup-steps decode steps and time --steps steps. avg_SPS = steps / s. Tokens/s are given two
ways: full-acceptance accounting `avg_SPS * batch * (1 + nextn)` (the reference's headline
formula) and real: tokens actually emitted / s.
Prefill (bench_prefill.py): rounds of --prefill-batch fresh prompts (prefix cache off, max_tokens 1);
skip 5 warm-up prefill steps, time 10 steps; tokens/s = prompt tokens computed / s;
--prefill-pipelined also over queued rounds with ZOS on.
Steady-state period (CUDA): the device time between the first and the last window step's completion
events over the steps between them (`period_ms`, idle included; `avg_sps_period`). The wall-clock
`avg_sps` also counts the work already queued when the window starts (with ZOS one step is in
flight, so a window of S steps holds ~S + 1 steps of device work): it reads low by ~1/S, which
longer windows (--steps) shrink: the default 200 steps keep it to ~0.5% (60 read ~1.7% low).
ZOS idle: with CUDA events at each step's device start and end, the idle gap between consecutive
decode steps as a fraction of the step time. A whole-step graph's start event is recorded once
its host work is done, right before its input copies, so the gap is the device's idle time
(before session 12 it was recorded as `launch` began, and the host-paced eager launches of the
fix-up then counted as step time, not idle: 0.4-0.7% was reported while the device idled ~25%).
Host stalls: the window's largest and total idle (`idle_gap_max_ms`, `idle_gap_total_ms`), the
gaps over SLOW_GAP_MS (`slow_gaps`: round, window step, ms) and Python's garbage collections in
the window by generation (`gc_pauses_in_window`).
Decode at batch 1 without speculation also reports the weight bytes a step must read and
weights / step time (`weight_read_tb_s` over the wall-clock window, `weight_read_tb_s_period` over
the steady-state period, and their fractions of the measured copy bandwidth on CUDA: issue 6's
`flash-slice` roofline, e.g. `--model preset:flash-slice --decode-batch-sizes 1`).
Every row of --result-jsonl is one measurement with its configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "deepinfer-kernels" / "diag"))
from bench_engine import build_engine, free_device_memory, make_prompts  # noqa: E402
from bench_prefill import bench_prefill, bench_prefill_pipelined  # noqa: E402
from roofline import measure_ceilings  # noqa: E402

# --grammar-compare: a long free string keeps every request under the mask (in its costliest state,
# most tokens allowed) for the whole window
LONG_STRING_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "minLength": 3000}},
                      "required": ["text"]}


def bench_decode(args, batch: int, zos: bool, nextn: int | None = None, varlen: bool | None = None,
                 compile_decode: bool | None = None, grammar: bool = False, invariant: bool = False,
                 compile_speculation: bool | None = None, decode_streams: bool | None = None) -> dict:
    from deepinfer_engine import SamplingParams
    from deepinfer_engine.structured_output import StructuredOutput

    extra = {} if nextn is None else {"num_speculative_tokens": nextn}
    if varlen is not None:
        extra["enable_mtp_varlen"] = varlen
    if compile_decode is not None:
        extra["compile_decode"] = compile_decode
    if compile_speculation is not None:
        extra["compile_speculation"] = compile_speculation
    if decode_streams is not None:
        extra["decode_streams"] = decode_streams
    t_start = time.perf_counter()
    previous = os.environ.get("DEEPINFER_BATCH_INVARIANT")
    os.environ["DEEPINFER_BATCH_INVARIANT"] = "1" if invariant else "0"   # read when the engine is built
    try:
        engine = build_engine(args, zero_overhead_scheduling=zos, max_num_seqs=max(batch, 1), **extra)
    finally:
        if previous is None:
            os.environ.pop("DEEPINFER_BATCH_INVARIANT")
        else:
            os.environ["DEEPINFER_BATCH_INVARIANT"] = previous
    startup_s = time.perf_counter() - t_start   # weights, KV pool, graph capture (and compile)
    # Enough tokens that no request finishes inside the window, even if every draft is accepted.
    params = SamplingParams(temperature=0, max_tokens=(args.warmup_steps + args.steps + 16) * (1 + engine.nextn),
                            ignore_eos=True,
                            structured_output=StructuredOutput.json_schema(LONG_STRING_SCHEMA) if grammar else None)
    # --rounds R: R windows over fresh prompts (at batch 1 one prompt is a small sample of acceptance)
    rounds = max(args.rounds, 1)
    prompts = make_prompts(batch * rounds, args.prompt_len, engine.vocab_size, seed=batch, code=args.code_prompts)
    host_s, host_window, spans, gaps = None, None, [], []
    period_ms, period_steps = 0.0, 0   # completion to completion inside each window (CUDA events)
    slow_gaps = []                    # (round, window step, ms) of idle gaps over SLOW_GAP_MS
    pauses = GcPauses()
    steps = elapsed = tokens = prefill_steps = drafts = 0
    for r in range(rounds):
        for p in prompts[r * batch: (r + 1) * batch]:
            engine.add_request(prompt_token_ids=p, params=params)
        decode_steps_before = engine.stats.num_decode_steps
        while engine.stats.num_decode_steps == decode_steps_before:   # prefill this round's prompts
            engine.step()
        for _ in range(args.warmup_steps):
            engine.step()
        engine.runner.timeline = [] if engine.device.type == "cuda" else None
        if args.host_timers and host_s is None:
            host_s = _time_host_phases(engine)
        tok0, steps0, prefills0, drafts0 = (engine.stats.num_generated_tokens, engine.stats.num_decode_steps,
                                            engine.stats.num_prefill_steps, engine.stats.num_draft_tokens)
        start = time.perf_counter()
        with pauses:
            for _ in range(args.steps):
                engine.step()
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
        elapsed += time.perf_counter() - start
        if host_s is not None:
            host_window = dict(host_s)   # the window only, not the abort steps after it
        steps += engine.stats.num_decode_steps - steps0
        tokens += engine.stats.num_generated_tokens - tok0
        prefill_steps += engine.stats.num_prefill_steps - prefills0
        drafts += engine.stats.num_draft_tokens - drafts0
        running = len(engine._requests)   # finished requests leave the table
        if running < batch:
            raise RuntimeError(f"decode window: {batch - running} of {batch} requests finished early")
        if engine.runner.timeline:
            tl = engine.runner.timeline
            spans += [s.elapsed_time(d) for s, d in tl]
            window_gaps = [tl[i][1].elapsed_time(tl[i + 1][0]) for i in range(len(tl) - 1)]
            gaps += window_gaps
            slow_gaps += [(r, i, round(g, 3)) for i, g in enumerate(window_gaps) if g > SLOW_GAP_MS]
            period_ms += tl[0][1].elapsed_time(tl[-1][1])
            period_steps += len(tl) - 1
        engine.runner.timeline = None
        _abort_all(engine)
    sps = steps / elapsed
    row = dict(kind="decode", engine="deepinfer", model=args.model, batch=batch, prompt_len=args.prompt_len,
               nextn=engine.nextn, varlen=engine.budget.varlen, zos=zos, grammar=grammar, batch_invariant=invariant,
               decode_streams=engine.model.decode_streams,
               cuda_graphs=engine.runner.graphs is not None,
               compiled=engine.runner.graphs is not None and engine.runner.graphs.compile,
               compiled_speculation=engine.runner.spec is not None and engine.runner.spec.compiled_tail is not None,
               startup_s=startup_s, avg_sps=sps,
               tokens_per_s_full_acceptance=sps * batch * (1 + engine.nextn),
               tokens_per_s_real=tokens / elapsed, rounds=rounds,
               drafts_verified_per_step=drafts / steps,   # varlen: the budget the policy spent
               mean_acceptance_length=engine.stats.mean_acceptance_length, step_ms=1e3 / sps,
               prefill_steps_in_window=prefill_steps)   # > 0: preemption recompute
    fit = engine.budget.step_time.fit() if engine.budget.varlen else None
    if fit is not None:   # the varlen policy's step-time line: ms = base + slope * rows
        row["step_time_fit"] = {"base_ms": round(fit[0], 4), "slope_ms_per_row": round(fit[1], 6)}
    if host_window is not None:   # host time per window step of each phase (ZOS hides what overlaps the device)
        row["host_ms_per_step"] = {k: round(v * 1e3 / steps, 3) for k, v in host_window.items()}
    if spans:
        row.update(device_step_ms=float(np.median(spans)), idle_gap_ms=float(np.median(gaps)),
                   idle_fraction=float(np.median(gaps) / np.median(spans)))
    if period_steps:
        row.update(period_ms=period_ms / period_steps, avg_sps_period=1e3 * period_steps / period_ms,
                   idle_gap_max_ms=float(np.max(gaps)), idle_gap_total_ms=float(np.sum(gaps)),
                   device_step_max_ms=float(np.max(spans)), slow_gaps=slow_gaps[:20], num_slow_gaps=len(slow_gaps))
    row["gc_pauses_in_window"] = pauses.summary()
    if batch == 1 and engine.nextn == 0:   # issue 6's decode roofline: bytes that must be read / step time
        wbytes = weight_bytes_per_decode_step(engine.runner.model)
        row.update(weight_bytes_per_step=wbytes, weight_read_tb_s=wbytes * sps / 1e12)
        if period_steps:
            row["weight_read_tb_s_period"] = wbytes * row["avg_sps_period"] / 1e12
    if engine._structured is not None:
        engine._structured.shutdown()
    del engine
    free_device_memory()
    return row


SLOW_GAP_MS = 0.2   # an idle gap between decode steps this long is listed (a host stall, not the pipeline)


class GcPauses:
    """Python's cyclic garbage collections while the context is open (it may be entered again):
    count and ms per generation. A collection runs on the host between launches; with ZOS it shows
    as device idle only when it outlasts the step in flight."""

    def __init__(self):
        self.by_gen: dict[int, list[float]] = {}
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.by_gen.setdefault(info["generation"], []).append((time.perf_counter() - self._t0) * 1e3)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict:
        return {f"gen{g}": {"count": len(v), "total_ms": round(sum(v), 3), "max_ms": round(max(v), 3)}
                for g, v in sorted(self.by_gen.items())}


def weight_bytes_per_decode_step(model) -> int:
    """Weight bytes one batch-1 decode step without speculation must read: the config's
    active-decode parameters (every backbone layer, routed experts counted top-k times, Engram by
    rows looked up; deepinfer_model.param_counts) plus the lm_head, at the model's weight dtype.
    KV and activations excluded, so bytes / step time is a lower bound of the bandwidth used."""
    from deepinfer_model import param_counts

    cfg = model.config
    element = model.lm_head.weight.element_size()
    return (param_counts(cfg).active_decode + cfg.vocab_size * cfg.hidden_size) * element


def _abort_all(engine) -> None:
    while engine.has_unfinished():
        for rid in list(engine._requests):
            engine.abort_request(rid)
        engine.step()


def _time_host_phases(engine) -> dict[str, float]:
    """Wrap the engine's per-step host phases with wall-clock accumulators (seconds, from now on)."""
    totals: dict[str, float] = {}
    targets = [(engine.runner, "launch"), (engine.runner, "complete"), (engine.runner, "collect"),
               (engine, "_finish_inflight"), (engine, "_schedule")]
    if engine._structured is not None:
        targets.append((engine._structured, "step_masks"))
    for obj, name in targets:
        original = getattr(obj, name)
        totals[name] = 0.0

        def timed(*a, _original=original, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _original(*a, **kw)
            finally:
                totals[_name] += time.perf_counter() - t0
        setattr(obj, name, timed)
    if engine._structured is not None:
        engine.runner.mask_provider = engine._structured.step_masks   # the runner holds the bound method
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="preset:mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--decode-batch-sizes", default="1,64")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--prefill-batch", type=int, default=64)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=200)   # the wall clock reads ~1/steps low: see the docstring
    ap.add_argument("--nextn", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="decode windows per row over fresh prompts, pooled (batch 1: more than one prompt)")
    ap.add_argument("--varlen", action="store_true")
    ap.add_argument("--nextn-list", default=None, help="comma-separated nextn values to run (e.g. 0,5)")
    ap.add_argument("--code-prompts", action="store_true", help="held-out stdlib function prompts (default model)")
    ap.add_argument("--varlen-compare", action="store_true", help="speculative rows also in the other varlen mode")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--zos-compare", action="store_true",
                    help="also run every decode row with ZOS off (with --varlen-compare: both varlen modes)")
    ap.add_argument("--compile-compare", action="store_true",
                    help="also run decode with the graphed step not compiled (compile_decode=False)")
    ap.add_argument("--compile-spec-compare", action="store_true",
                    help="speculative rows also with main keys, verification and draft head through torch.compile "
                         "(compile_speculation)")
    ap.add_argument("--grammar-compare", action="store_true",
                    help="also run decode with every request under a JSON schema (mask overhead; needs a tokenizer)")
    ap.add_argument("--streams-compare", action="store_true",
                    help="also run decode with the step's side streams off (decode_streams=False, one stream)")
    ap.add_argument("--invariant-compare", action="store_true",
                    help="also run decode with DEEPINFER_BATCH_INVARIANT=1 (cost of batch invariance)")
    ap.add_argument("--host-timers", action="store_true",
                    help="report host ms per decode step of launch / complete / collect / ledger / masks")
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--prefill-chunk-sizes", default=None,
                    help="comma-separated prefill budgets per step to sweep (SPEC §7: 4096..65536); "
                         "default: --max-num-batched-tokens only")
    ap.add_argument("--prefill-pipelined", action="store_true",
                    help="also measure prefill over a queue of prompt rounds with ZOS on (the engine's default loop)")
    ap.add_argument("--prefill-rounds", type=int, default=8, help="rounds of --prefill-batch prompts queued (pipelined)")
    ap.add_argument("--peer", action="store_true", help="run the HF transformers peer in the same process")
    ap.add_argument("--result-jsonl", type=Path, default=None)
    args = ap.parse_args()
    if args.host_timers and args.rounds > 1:
        ap.error("--host-timers needs --rounds 1 (the timers would also count the later rounds' warm-up)")

    rows = []
    if args.device == "cuda":
        rows.append(dict(kind="ceilings", **measure_ceilings()))
    first_nextn = int((args.nextn_list or str(args.nextn)).split(",")[0])
    for b in (int(x) for x in args.decode_batch_sizes.split(",") if x):   # "" = prefill only
        for nextn in (int(x) for x in (args.nextn_list or str(args.nextn)).split(",")):
            rows.append(bench_decode(args, b, zos=True, nextn=nextn))
            if args.varlen_compare and nextn > 0:  # the other verification-length mode, same run
                rows.append(bench_decode(args, b, zos=True, nextn=nextn, varlen=not args.varlen))
            if args.compile_spec_compare and nextn > 0:   # the speculative part through torch.compile
                rows.append(bench_decode(args, b, zos=True, nextn=nextn, compile_speculation=True))
                if args.varlen_compare:
                    rows.append(bench_decode(args, b, zos=True, nextn=nextn, varlen=not args.varlen,
                                             compile_speculation=True))
            if args.zos_compare:   # the same rows with ZOS off (varlen: its split is not one step late then)
                rows.append(bench_decode(args, b, zos=False, nextn=nextn))
                if args.varlen_compare and nextn > 0:
                    rows.append(bench_decode(args, b, zos=False, nextn=nextn, varlen=not args.varlen))
        if args.grammar_compare:   # every request under a JSON schema, same nextn as the first row
            rows.append(bench_decode(args, b, zos=True, nextn=first_nextn, grammar=True))
        if args.invariant_compare:
            rows.append(bench_decode(args, b, zos=True, nextn=first_nextn, invariant=True))
        if args.compile_compare:
            rows.append(bench_decode(args, b, zos=True, compile_decode=False))
        if args.streams_compare:   # every kernel on one stream, same nextn as the first row
            rows.append(bench_decode(args, b, zos=True, nextn=first_nextn, decode_streams=False))
    if not args.no_prefill:
        for chunk in (int(c) for c in (args.prefill_chunk_sizes or str(args.max_num_batched_tokens)).split(",")):
            rows.append(bench_prefill(args, chunk))
            if args.prefill_pipelined:
                rows.append(bench_prefill_pipelined(args, chunk))
    if args.peer:
        from peer_hf import bench_peer
        rows.extend(bench_peer(args))
    copy_bw = next((r["copy_bw_tb_s"] for r in rows if r["kind"] == "ceilings"), None)
    for row in rows:
        if copy_bw and "weight_read_tb_s" in row:
            row["weight_read_fraction_of_copy"] = row["weight_read_tb_s"] / copy_bw
        if copy_bw and "weight_read_tb_s_period" in row:
            row["weight_read_fraction_of_copy_period"] = row["weight_read_tb_s_period"] / copy_bw
        print(json.dumps(row), flush=True)
    if args.result_jsonl:
        with args.result_jsonl.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
