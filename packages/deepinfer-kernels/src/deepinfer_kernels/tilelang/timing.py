"""Timing and roofline helpers of the TileLang benchmarks and GPU tools: CUDA-event times of a call
inside CUDA graphs with L2 flushed before it (``cuda_time_us``), the H200 ceilings and the ratios
against them (``roofline``), and the pytest-benchmark record that carries them
(``record_benchmark``). Re-exported by ``testing``.
"""

from collections.abc import Callable

import torch

# H200 (SM90) roofline used in every report: measured device-to-device copy bandwidth and the
# measured dense bf16 matmul rate of the benchmark machine.
HBM_BYTES_PER_S = 4.29e12
BF16_FLOPS = 793e12


IN_GRAPH_COPIES = 8   # calls per timing graph (graph=True): amortizes the one graph launch

_copy_rate: dict[int, float] = {}


def copy_bytes_per_s(nbytes: int = 2 << 30, iters: int = 20) -> float:
    """The device-to-device copy bandwidth measured in this process (bytes read + bytes written per
    second, ``iters`` back-to-back copies of ``nbytes``; once per process and size): the ceiling of
    the run itself, beside the fixed ``HBM_BYTES_PER_S``."""
    if nbytes not in _copy_rate:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        _copy_rate[nbytes] = 2 * nbytes * iters / (start.elapsed_time(end) * 1e-3)
        del src, dst
    return _copy_rate[nbytes]


def _event_times_us(call: Callable[[], object], reps: int, before: Callable[[], object] | None = None) -> list:
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)


def capture_graph(body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`body` captured in a CUDA graph (run eagerly first if it compiles), replayed once, synced."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    g.replay()
    torch.cuda.synchronize()
    return g


def l2_flusher(mode: str = "write") -> Callable[[], object]:
    """A call that leaves nothing of the timed call's data in L2: "write" overwrites a 256 MB buffer
    (L2 is left full of the buffer's dirty lines, and the next kernel's misses write them back to
    HBM), "read" reads one (L2 is left full of clean lines, as a decode step's weight reads leave
    it). ``packages/deepinfer-kernels/diag/l2_flush_probe.py`` times kernels after each."""
    if mode not in ("write", "read"):
        raise ValueError(f"flush mode {mode!r}: 'write' or 'read'")
    buf = torch.zeros(64 * 1024 * 1024, dtype=torch.float32, device="cuda")   # 256 MB, over the 50 MB L2
    if mode == "write":
        return buf.zero_
    total = torch.zeros((), dtype=torch.float32, device="cuda")
    return lambda: torch.sum(buf, dim=0, out=total)


def cuda_time_us(fn: Callable[[], object], *, reps: int = 50, warmup: int = 5, flush_l2: bool | str = True,
                 graph: bool = False) -> dict:
    """Median / min per-call time in microseconds with CUDA events; optionally overwrites a 256 MB
    buffer before each call so data never starts L2-resident (``flush_l2="read"``: reads it instead,
    ``l2_flusher``).

    ``graph=True``: the device time of the call's kernels as a decode-step graph runs them, between
    other kernels. One graph holds ``IN_GRAPH_COPIES`` x (L2 flush, call); a second the flushes
    alone; median_us = (median replay of the first - median replay of the second) / copies, so
    neither the flush nor the graph's launch latency (~5-10 us, paid once per decode step in the
    engine, not per kernel) is counted. ``replay_median_us``: one call per graph replay, launch
    latency included (what these benchmarks reported until 2026-11-30). Raises
    if ``fn`` cannot be captured (host syncs)."""
    do_flush = l2_flusher("write" if flush_l2 is True else flush_l2) if flush_l2 else (lambda: None)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if not graph:
        times = _event_times_us(fn, reps, do_flush)
        return {"median_us": times[len(times) // 2], "min_us": times[0], "reps": reps}
    single = capture_graph(fn)
    replay = _event_times_us(single.replay, reps, do_flush)

    def calls():
        for _ in range(IN_GRAPH_COPIES):
            do_flush()
            fn()

    def flushes():
        for _ in range(IN_GRAPH_COPIES):
            do_flush()

    with_calls = _event_times_us(capture_graph(calls).replay, reps)
    flush_only = _event_times_us(capture_graph(flushes).replay, reps)
    per_call = [(a - b) / IN_GRAPH_COPIES for a, b in zip(with_calls, flush_only)]   # sorted pairs: min, ..., max
    return {"median_us": per_call[len(per_call) // 2], "min_us": min(per_call), "reps": reps,
            "replay_median_us": replay[len(replay) // 2], "in_graph_copies": IN_GRAPH_COPIES}


def roofline(bytes_moved: float, seconds: float, flops: float = 0.0) -> dict:
    out = {"TB/s": bytes_moved / seconds / 1e12, "%HBM": 100.0 * bytes_moved / seconds / HBM_BYTES_PER_S}
    if flops:
        out["TFLOP/s"] = flops / seconds / 1e12
        out["%bf16"] = 100.0 * flops / seconds / BF16_FLOPS
    return out


# ----------------------------------------------------------------------------- benchmarks


def record_benchmark(benchmark, fn: Callable[[], object], *, bytes_moved: float, flops: float = 0.0,
                     ref_fn: Callable[[], object] | None = None, reps: int = 30, flush_l2: bool = True,
                     extra: dict | None = None, graph: bool = True) -> dict:
    """Time ``fn`` with CUDA events (median of ``reps``, L2 flushed before each call), attach the
    roofline ratios (``%HBM``: against ``HBM_BYTES_PER_S``; ``%copy_run``: against the copy bandwidth
    measured in this process, ``copy_bytes_per_s``), the first-call time (compile or cache load), the
    compile log and the torch reference time to ``benchmark.extra_info``, then let pytest-benchmark
    time it as well.

    ``median_us`` (and the ratios) is the device time of ``fn`` inside a CUDA graph, as the
    engine's decode graphs run it (``cuda_time_us(graph=True)``; ``replay_median_us``: one call per
    replay, graph launch included); ``eager_median_us`` is the same call launched from Python,
    host launch costs included. ``graph=False`` for calls that sync with the host (not
    capturable): both are then the eager time (``graphed: False``)."""
    import time

    from deepinfer_kernels.tilelang._common import compile_times

    before = set(compile_times())
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    eager = cuda_time_us(fn, reps=reps, flush_l2=flush_l2)
    stats = cuda_time_us(fn, reps=reps, flush_l2=flush_l2, graph=True) if graph else eager
    info = dict(stats)
    info.update({"eager_median_us": eager["median_us"], "graphed": graph})
    info.update({"bytes": float(bytes_moved), "flops": float(flops), "first_call_s": first_call_s})
    info.update(roofline(bytes_moved, stats["median_us"] * 1e-6, flops))
    if bytes_moved:       # against the copy bandwidth measured in this run, too
        copy_rate = copy_bytes_per_s()
        info["copy_run_TB/s"] = copy_rate / 1e12
        info["%copy_run"] = 100.0 * bytes_moved / (stats["median_us"] * 1e-6) / copy_rate
    info["compile_s"] = {k: round(v, 2) for k, v in compile_times().items() if k not in before}
    if ref_fn is not None:
        ref = cuda_time_us(ref_fn, reps=3, warmup=1, flush_l2=False)
        info["ref_median_us"] = ref["median_us"]
        info["speedup_vs_ref"] = ref["median_us"] / stats["median_us"]
    if extra:
        info.update(extra)
    benchmark.extra_info.update(info)
    benchmark.pedantic(lambda: (fn(), torch.cuda.synchronize()), rounds=10, iterations=1, warmup_rounds=1)
    return info
