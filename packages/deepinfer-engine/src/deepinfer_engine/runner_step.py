"""What crosses the ModelRunner's boundary: a launched step, its results, what it leaves for the next.

    runner.launch(out, batch, prev) -> LaunchedStep             (whole-step graph, or eager)
                                    -> DeferredStep             (grammar step: forward graph only)
    runner.complete(DeferredStep)   -> LaunchedStep             (masks built, tail graph replayed)
    runner.collect(LaunchedStep)    -> StepResult               (host numpy, request order)
    LaunchedStep.state              -> the next launch's `prev` (zero-overhead scheduling)

A `LaunchedStep` has enqueued all its device work and started the copies of its results to the
host (`StepTensors`); `collect` waits for those copies only. Nothing here syncs the device.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_engine.sampler import SamplingBatch
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_sched import SchedulerOutput


class LaunchPath(enum.Enum):
    """How `ModelRunner.launch` ran a step (decode_step.py describes the three)."""

    EAGER = "eager"             # piecewise: forward (graph or eager), then sampler and draft head eagerly
    WHOLE_STEP = "whole_step"   # one replay of the bucket's whole-step graph (plain sampling)
    SPLIT = "split"             # grammar step: forward graph, host-built masks, then the tail graph


@dataclass
class StepResult:
    """One step's SampledInfo in request order of the SchedulerOutput (host numpy arrays)."""

    token_ids: np.ndarray          # [req_cnt] int32 main token (0 for prefill chunks that do not sample)
    token_logprobs: np.ndarray     # [req_cnt] float32
    verified_token_ids: np.ndarray | None  # [total_q] int32 VERIFIED_END-terminated, None without drafts
    verified_logprobs: np.ndarray | None   # [total_q] float32
    top_logprobs: list[list[dict[int, float]] | None]  # [req_cnt] per emitted token
    num_accepted: np.ndarray | None = None  # [req_cnt] int32 accepted drafts (decode steps)
    confidence: np.ndarray | None = None    # [req_cnt, nextn] float32 next step's draft confidences
    device_ms: float = 0.0                  # time of the step's device work

    @staticmethod
    def empty(req_cnt: int) -> StepResult:
        return StepResult(np.zeros(req_cnt, np.int32), np.zeros(req_cnt, np.float32), None, None, [None] * req_cnt)


@dataclass(slots=True)
class StepTensors:
    """A step's results, request order: on the device until `to_host` (a copy each, asynchronous on
    CUDA). A field a path does not produce is None (without speculation nothing is verified)."""

    token_ids: torch.Tensor                         # [req_cnt] int64 (int32 from the graphs) main token
    token_logprobs: torch.Tensor                    # [req_cnt] float32
    verified_token_ids: torch.Tensor | None = None  # [total_q] int32, VERIFIED_END past the accepted drafts
    verified_logprobs: torch.Tensor | None = None   # [total_q] float32
    num_accepted: torch.Tensor | None = None        # [req_cnt] int32 accepted drafts
    confidence: torch.Tensor | None = None          # [req_cnt, nextn] float32 next step's draft confidences
    top_values: torch.Tensor | None = None          # [rows, n_max] float32 top-n raw logprobs (None: not asked)
    top_ids: torch.Tensor | None = None             # [rows, n_max] int64
    top_ftp: torch.Tensor | None = None             # [n_sampled] int32 first logits row of each sampled request
    top_accepted: torch.Tensor | None = None        # [n_sampled] int32 accepted drafts of each sampled request

    def to_host(self) -> StepTensors:
        """Start the copies to the host (non-blocking: valid once an event recorded after them has run)."""
        return StepTensors(_to_host(self.token_ids), _to_host(self.token_logprobs), _to_host(self.verified_token_ids),
                           _to_host(self.verified_logprobs), _to_host(self.num_accepted), _to_host(self.confidence),
                           _to_host(self.top_values), _to_host(self.top_ids), _to_host(self.top_ftp),
                           _to_host(self.top_accepted))


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to("cpu", non_blocking=True)


def numpy_or_none(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy()


@dataclass(slots=True)
class DeviceStepState:
    """What step N leaves on the device for step N+1's inputs (per request of step N)."""

    token_ids: torch.Tensor      # [req_cnt_N] int64 / int32 main token sampled (0 where none was)
    rejected_rows: torch.Tensor | None  # [req_cnt_N] int64 rows the ledger will not keep (rejected drafts)
    has_drafts: bool = True      # step N verified drafts (False: rejected_rows is all 0 or None, rows do not move)
    in_carry: bool = False       # a whole-step graph left these in the graphs' carry (decode_step.StepCarry)


@dataclass(slots=True)
class LaunchedStep:
    """A step whose device work is all enqueued; `ModelRunner.collect` turns it into a StepResult."""

    out: SchedulerOutput
    path: LaunchPath
    results: StepTensors             # host copies on CUDA (filled asynchronously until `done`), else device = host
    done: torch.cuda.Event | None    # recorded after the copies; None on the CPU
    started: torch.cuda.Event | None  # at the step's first device work; None on the CPU
    cpu_ms: float                    # host time of the launch (the CPU's stand-in for device time)
    top_counts: list[int]            # [n_sampled] top-n logprobs asked per sampled request
    state: DeviceStepState           # the next step's `prev` under zero-overhead scheduling


@dataclass(slots=True)
class DeferredStep:
    """A grammar step launched up to its target forward (graph): the sampler with the masks and the
    draft head wait until the host has advanced the matchers and built the masks (`complete`)."""

    out: SchedulerOutput
    started: torch.cuda.Event | None
    cpu_ms: float                        # host time of the launch so far
    meta: ForwardMetadata                # the step's metadata, drafts filled in
    batch: SamplingBatch
    mtp_slots: torch.Tensor | None       # [req_cnt] int32 (None without speculation)
    read_rows: torch.Tensor | None       # [total_q] MTP rows the drafts are verified against
    input_ids_host: torch.Tensor | None  # [total_q] int64 input tokens incl. drafts, copied asynchronously
    copied: torch.cuda.Event | None      # recorded after that copy (before the forward)
