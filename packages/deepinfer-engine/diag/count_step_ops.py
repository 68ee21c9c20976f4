"""Kernel-launching ops of one whole decode step, by phase, counted on the CPU.

A small model's decode step is launch-bound on the GPU (docs/benchmarks.md), so the number of
kernels it launches predicts its time. This runs one padded whole step (`run_decode_step`, what
the CUDA graph replays) on the CPU's capturable path and counts the ATen ops it dispatches: ops
that have a TileLang kernel on SM90 count as one launch, an RMSNorm counts as the launches of its
CUDA path (one fused kernel; float32 casts for dtype mixes the mixed-dtype kernel does not take),
views and host scalars do not count.
Calibration (2026-11-30, default model, batch 1): 2,663 ops at nextn 5 and 1,708 at nextn 0
(ratio 1.559) against H200 steps of 7.47 and 4.81 ms (ratio 1.553); later, with RMSNorm counted as
on CUDA, 1,534 and 1,013 against H200 device steps of 3.36 and 2.41 ms (2.2-2.4 us per launch).

    python packages/deepinfer-engine/diag/count_step_ops.py --nextn 5 [--model default] [--batch 1] [--top 12] [--by-function 20]
        [--sampling greedy|general]
"""

from __future__ import annotations

import collections
import contextlib
import sys
from dataclasses import dataclass

from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer_kernels.tilelang import LAUNCHERS
from deepinfer_model.paged.streams import current_chain

from _cli import model_run_parser

NOT_LAUNCHES = {"view", "_unsafe_view", "t", "expand", "slice", "select", "unsqueeze", "squeeze", "reshape",
                "permute", "transpose", "as_strided", "alias", "detach", "unbind", "split", "split_with_sizes",
                "chunk", "narrow", "unflatten", "flatten", "view_as_real", "view_as_complex", "lift_fresh",
                "scalar_tensor", "_local_scalar_dense", "sym_size", "sym_stride", "empty", "empty_like",
                "movedim", "expand_as", "view_as"}


_OUR_SOURCES = ("/deepinfer_model/", "/deepinfer_kernels/ops/", "/deepinfer_engine/")


def _our_caller() -> str:
    """`file.py:function` of the innermost deepinfer frame on the stack (where a launch is written)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if any(src in path for src in _OUR_SOURCES) and "/count_step_ops" not in path:
            return f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "-"


@dataclass
class StepLaunches:
    """Kernel launches of one decode step, three ways."""

    by_phase: dict[str, collections.Counter]   # phase -> op name -> launches
    by_function: collections.Counter           # "file.py:function" of ours that issued them -> launches
    by_stream: collections.Counter             # "main", or the side stream (engine/streams.py) -> launches
    sequence: list                             # the step's first launches in issue order: (stream, op, function)


class StepOpCounter(TorchDispatchMode):
    """Counts dispatched ops per phase (a stack of labels pushed by `phase`) and per function of
    the model / kernels / engine code that issued them."""

    def __init__(self, sequence: int = 0):
        super().__init__()
        self.sequence_limit = sequence
        self.sequence: list[tuple[str, str, str]] = []   # the first launches: (stream, op, issuing function)
        self.phases = ["other"]
        self.inside_kernel = 0
        self.active = False   # counting: inside the one step measured
        self.by_phase: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.by_function: collections.Counter = collections.Counter()
        self.by_stream: collections.Counter = collections.Counter()

    def add(self, name: str, n: int = 1) -> None:
        where, chain = _our_caller(), current_chain()
        self.by_phase[self.phases[-1]][name] += n
        self.by_function[where] += n
        self.by_stream[chain] += n
        if len(self.sequence) < self.sequence_limit:
            self.sequence.append((chain, name, where))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in NOT_LAUNCHES and not self.inside_kernel:
            self.add(name)
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def phase(self, label: str):
        self.phases.append(label)
        try:
            yield
        finally:
            self.phases.pop()

    @contextlib.contextmanager
    def launches(self, label: str, n: int = 1):
        """A call that is `n` kernel launches on the GPU (a TileLang kernel: 1): counted as such, the
        ops of its CPU path not."""
        if self.active and not self.inside_kernel:
            self.add(label, n)
        self.inside_kernel += 1
        try:
            yield
        finally:
            self.inside_kernel -= 1


def _cuda_rms_norm_launches(x, weight) -> int:
    """Kernel launches of `modules.norm.rms_norm` on CUDA (not batch-invariant): one for one weight
    vector, torch's fused norm or (bf16 / fp16 x, float32 weight) the TileLang mixed-dtype norm;
    other mixes add float32 casts; several stacked weights take the unfused formula (counted op by
    op: -1 here)."""
    import torch
    if weight.dim() != 1:
        return -1
    d = x.shape[-1]
    if x.dtype == weight.dtype or (x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == torch.float32
                                   and d % 32 == 0 and 32 <= d <= 8192):
        return 1
    return 1 + (x.dtype != torch.float32) * 2 + (weight.dtype != torch.float32)


def _count_rms_norm_as_cuda(counter: StepOpCounter, module, undo: list) -> None:
    original = module.rms_norm

    def counted(x, weight, eps):
        n = _cuda_rms_norm_launches(x, weight)
        if n < 0:   # the formula op by op
            return original(x, weight, eps)
        with counter.launches("rms_norm (CUDA)", n):
            return original(x, weight, eps)
    module.rms_norm = counted
    undo.append(lambda: setattr(module, "rms_norm", original))


def _wrap(obj, attr: str, enter, undo: list) -> None:
    """obj.attr runs inside `enter()` until the callables in `undo` run."""
    original = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        with enter():
            return original(*args, **kwargs)
    setattr(obj, attr, wrapped)
    undo.append(lambda: setattr(obj, attr, original))


def _public_ops() -> dict:
    """op name -> the public function of `deepinfer_kernels.ops` that dispatches it, for every op
    with a TileLang launcher."""
    import importlib
    import pkgutil

    import deepinfer_kernels.ops as ops_pkg
    found = {}
    for info in pkgutil.walk_packages(ops_pkg.__path__, "deepinfer_kernels.ops."):   # ops.sampling too
        module = importlib.import_module(info.name)
        for op in LAUNCHERS:
            fn = getattr(module, op, None)
            if callable(fn) and getattr(fn, "__module__", None) == module.__name__:
                found[op] = fn
    return found


def _import_our_modules() -> None:
    """Import the model and engine modules up front: one imported lazily while the wrappers below are
    in place would bind a wrapper for good (`from ... import op` copies whatever is bound then)."""
    import importlib
    import pkgutil

    import deepinfer_engine
    import deepinfer_model
    for package in (deepinfer_model, deepinfer_engine):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                importlib.import_module(info.name)
            except ImportError:   # optional extras (the server's dependencies): not on the step's path
                pass


def _wrap_everywhere(fn, enter, undo: list) -> None:
    """Every `deepinfer_*` module attribute bound to `fn` (its definition and each `from ... import`
    of it) runs it inside `enter()` until the callables in `undo` run."""
    def wrapped(*args, **kwargs):
        with enter():
            return fn(*args, **kwargs)
    for name, module in list(sys.modules.items()):
        if not name.startswith("deepinfer_") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is fn:
                setattr(module, attr, wrapped)
                undo.append(lambda module=module, attr=attr: setattr(module, attr, fn))


def count(model: str | None, nextn: int, batch: int, greedy: bool = True, sequence: int = 0) -> StepLaunches:
    import deepinfer_engine.cuda_graphs as cuda_graphs
    import deepinfer_model.modules.dspark as mod_dspark
    import deepinfer_model.modules.mla as mod_mla
    import deepinfer_model.modules.norm as mod_norm
    from deepinfer_engine import LLM, SamplingParams
    from deepinfer_engine.sampler import Sampler
    from deepinfer_kernels.ops.capture import force_capturable

    counter, undo = StepOpCounter(sequence), []
    llm = LLM(model, device="cpu", dtype="bfloat16", block_size=16, max_num_batched_tokens=256,
              max_num_seqs=batch, max_model_len=512, num_speculative_tokens=nextn, enable_mtp_varlen=False)
    _import_our_modules()
    for op, fn in _public_ops().items():   # one launch on SM90, wherever the model imported it from
        _wrap_everywhere(fn, lambda op=op: counter.launches("tilelang:" + op), undo)
    for module in (mod_norm, mod_dspark):   # RMSNorm.forward calls norm.rms_norm; the draft calls its import
        _count_rms_norm_as_cuda(counter, module, undo)
    # the residual add + norm: one TileLang launch on CUDA for the 2-D bf16 rows the step has
    _wrap(mod_norm.RMSNorm, "add_forward", lambda: counter.launches("tilelang:add_rms_norm"), undo)
    # the decode latent's norm + cat + FP8 store: one launch on CUDA (bf16 rows, float32 norm weight)
    _wrap(mod_mla.MLAAttention, "store_latent", lambda: counter.launches("tilelang:store_normed_kv_fp8"), undo)
    engine, net = llm.engine, llm.engine.runner.model
    _wrap(net, "forward", lambda: counter.phase("target forward"), undo)
    _wrap(net, "dspark_write_main_keys", lambda: counter.phase("DFlash main keys"), undo)
    _wrap(net, "dspark_draft", lambda: counter.phase("draft head"), undo)
    _wrap(Sampler, "sample", lambda: counter.phase("sampler"), undo)
    _wrap(Sampler, "sample_tokens", lambda: counter.phase("sampler"), undo)   # a step without speculation
    counted = []
    step = cuda_graphs.run_decode_step

    def counted_step(*args, **kwargs):
        inputs = kwargs.get("inputs", args[4] if len(args) > 4 else None)
        if counted or inputs.batch.all_greedy != greedy:   # the variant asked for, once
            return step(*args, **kwargs)
        counted.append(True)
        counter.active = True
        try:
            with counter, force_capturable():
                return step(*args, **kwargs)
        finally:
            counter.active = False
    cuda_graphs.run_decode_step = counted_step
    try:
        engine.runner.enable_cuda_graphs(batch * (nextn + 1), engine.max_model_len, interval=8)
        prompts = [[5 + i, 6, 7, 8, 9, 10, 11, 12] * 4 for i in range(batch)]
        llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0 if greedy else 0.8, seed=0, max_tokens=4,
                     ignore_eos=True), use_tqdm=False)
    finally:
        cuda_graphs.run_decode_step = step
        for restore in reversed(undo):
            restore()
    return StepLaunches(dict(counter.by_phase), counter.by_function, counter.by_stream, counter.sequence)


def main() -> None:
    ap = model_run_parser(__doc__, model="default", nextn=5)
    ap.add_argument("--top", type=int, default=0, help="also list the most frequent ops of each phase")
    ap.add_argument("--by-function", type=int, default=0, metavar="N",
                    help="also list the N functions of the model / kernels / engine code issuing the most launches")
    ap.add_argument("--sampling", choices=("greedy", "general"), default="greedy",
                    help="the step graph variant counted: all-greedy (what temperature-0 benchmarks replay) or general")
    ap.add_argument("--sequence", type=int, default=0, metavar="N",
                    help="also list the step's first N launches in issue order (stream, op, issuing function)")
    args = ap.parse_args()
    res = count(None if args.model == "default" else args.model, args.nextn, args.batch,
                greedy=args.sampling == "greedy", sequence=args.sequence)
    total = sum(sum(c.values()) for c in res.by_phase.values())
    print(f"{args.model}, nextn {args.nextn}, batch {args.batch}, {args.sampling} sampling: {total} kernel launches "
          "per decode step")
    for label, ops in sorted(res.by_phase.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"  {label:18s} {sum(ops.values()):6d}" + (f"  {ops.most_common(args.top)}" if args.top else ""))
    # "main" is the capture stream: the chain every side stream forks from and joins back into
    print("launches by stream (decode side streams on): "
          + ", ".join(f"{name} {n}" for name, n in res.by_stream.most_common()))
    if args.by_function:
        print("launches by issuing function:")
        for where, n in res.by_function.most_common(args.by_function):
            print(f"  {n:6d}  {where}")
    if args.sequence:
        print(f"the first {len(res.sequence)} launches:")
        for i, (chain, name, where) in enumerate(res.sequence):
            print(f"  {i:4d}  {chain:8s} {name:28s} {where}")


if __name__ == "__main__":
    main()
