"""Independent chains of a decode step's kernels, launched on side CUDA streams.

At decode sizes most kernels fill a few SMs for a few microseconds, so a layer's serial chain of
~40 launches leaves the GPU mostly idle. Chains that do not read each other's results run side by
side when launched on different streams (a CUDA graph keeps the fork / join edges, so its replay
runs them concurrently too). `engine/forward.py` uses five side streams at decode:

- ``rows``: what depends on the rows only, shared by the layers: the RoPE tables, the window
  slots, the Engram ids, n-gram buckets and projected lookups, the far-entry slots per ratio; beside
  the first layers (each part joined where a layer first reads it);
- ``query``: q_a norm, q_b GEMM, RoPE (joined before attention), and from it ``indexer``: the
  indexer's query GEMM and top-k, beside the q_b GEMM;
- ``compress``: an encoder source's compressor and the YOCO consumer-side compressors, joined only
  at the end of the forward. Their entries are read by later steps only: a decode row's far entries
  end at least W positions before it, the entries a step closes end at its own rows' positions,
  and a request's rows of one step span at most nextn + 1 < W positions (`usable` checks it);
- ``shared``: the MoE shared expert, beside the routing and the routed experts' GEMMs (joined at
  their combine).

Every kernel and its inputs are the same as on one stream, so results are bit-identical
(`tests/test_decode_streams_cuda.py` of this package). Memory: a tensor used on a stream other than
the one that allocated it is marked with `record_stream`, so the caching allocator does not hand its
block to another allocation before that stream's use has run (under graph capture torch defers such
frees until the capture ends).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}
_RUNNING: list[str] = []   # names of the `DecodeStreams.on` blocks being run, innermost last


def current_chain() -> str:
    """The side stream whose block is running, "main" outside every block: the stream a launch
    goes to when side streams are on. Tracked on the CPU too (tools/count_step_ops.py)."""
    return _RUNNING[-1] if _RUNNING else "main"


def _side_stream(device: torch.device, name: str) -> torch.cuda.Stream:
    key = (device.index if device.index is not None else torch.cuda.current_device(), name)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=device)
    return _STREAMS[key]


class DecodeStreams:
    """Side streams for one forward. Disabled (every block runs inline on the current stream):
    off the GPU, at prefill, under torch.compile, or when the model turned them off."""

    def __init__(self, device: torch.device, enabled: bool):
        self.enabled = enabled and device.type == "cuda" and not torch.compiler.is_compiling()
        self.device = device
        self._forked: set[str] = set()
        self._marks: dict[tuple[str, str], torch.cuda.Event] = {}

    @staticmethod
    def usable(model, decode: bool) -> bool:
        """Side streams for this forward: decode steps of a model that enables them, whose rows of
        one request (at most nextn + 1) cannot reach each other's far entries (nextn + 1 < W)."""
        cfg = model.config
        return decode and getattr(model, "decode_streams", False) and cfg.nextn + 1 < cfg.sliding_window

    @contextlib.contextmanager
    def on(self, name: str, reads: tuple[torch.Tensor | None, ...] = ()) -> Iterator[None]:
        """Run the block on side stream `name`, after everything launched so far on the current
        stream; `reads`: tensors of the current stream the block reads (kept from reuse until it ran)."""
        _RUNNING.append(name)
        try:
            if not self.enabled:
                yield
                return
            side = _side_stream(self.device, name)
            main = torch.cuda.current_stream(self.device)
            side.wait_stream(main)
            for t in reads:
                if t is not None:
                    t.record_stream(side)
            self._forked.add(name)
            with torch.cuda.stream(side):
                yield
        finally:
            _RUNNING.pop()

    def mark(self, name: str, label: str) -> None:
        """Inside `on(name)`: what side stream `name` has been given so far is part `label`, which
        `join_part` can wait for without waiting for the rest of the stream."""
        if self.enabled:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._marks[(name, label)] = event

    def join_part(self, name: str, label: str) -> None:
        """The current stream waits for part `label` of side stream `name` (`mark`); the whole
        stream when that part was not marked."""
        event = self._marks.get((name, label)) if self.enabled else None
        if event is None:
            self.join(name)
        elif name in self._forked:
            torch.cuda.current_stream(self.device).wait_event(event)

    def join(self, name: str, outputs: tuple[torch.Tensor | None, ...] = ()) -> None:
        """The current stream waits for side stream `name`; `outputs`: tensors it allocated that the
        current stream reads from here on."""
        if not self.enabled or name not in self._forked:
            return
        main = torch.cuda.current_stream(self.device)
        main.wait_stream(_side_stream(self.device, name))
        for t in outputs:
            if t is not None:
                t.record_stream(main)
        self._forked.discard(name)

    def join_all(self) -> None:
        """Join every stream forked and not yet joined (the end of a forward: a captured graph must
        end on its capture stream)."""
        for name in list(self._forked):
            self.join(name)
