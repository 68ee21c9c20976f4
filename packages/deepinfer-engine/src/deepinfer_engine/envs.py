"""DEEPINFER_* environment knobs, parsed in one place with their defaults (SPEC §4).

Read through `Envs.from_environ()` once per engine; nothing else here reads os.environ. The
kernels package's own knobs are checked there too (`Envs.kernels`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from deepinfer_kernels.envs import KernelEnvs, env_flag


def _int(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value}: must be >= {minimum}")
    return value


def _floats(name: str) -> tuple[float, ...] | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return tuple(float(x) for x in raw.split(","))
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a float or a comma-separated list of floats") from None


@dataclass(frozen=True)
class Envs:
    use_nextn_decode: int                  # DEEPINFER_USE_NEXTN_DECODE: drafts per step, 0 = no speculation
    enable_mtp_varlen: bool                # DEEPINFER_ENABLE_MTP_VARLEN: confidence-scheduled draft lengths (default
                                           #   off: never faster than fixed on the H200, docs/benchmarks.md)
    max_backtracking_tokens: int           # DEEPINFER_MAX_BACKTRACKING_TOKENS (>= nextn + 1)
    yoco_prefill_keep_tokens: int          # DEEPINFER_YOCO_PREFILL_KEEP_TOKENS: tail tokens a prefix hit
                                           #   leaves to recompute (the engine keeps >= W + backtracking)
    zero_overhead_scheduling: bool         # DEEPINFER_ZERO_OVERHEAD_SCHEDULING
    cudagraph_batch_size_interval: int     # DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL
    compile_decode: bool                   # DEEPINFER_COMPILE_DECODE: inductor-compile the graphed decode step
    compile_speculation: bool              # DEEPINFER_COMPILE_SPECULATION: inductor-compile main keys, verification, draft head
    batch_invariant: bool                  # DEEPINFER_BATCH_INVARIANT
    decode_streams: bool                   # DEEPINFER_DECODE_STREAMS: side streams for a decode step's independent chains
    confidence_head_temperature: tuple[float, ...] | None  # DEEPINFER_DFLASH_CONFIDENCE_HEAD_TEMPERATURE
    prefill_attempt_interval: int          # DEEPINFER_PREFILL_ATTEMPT_INTERVAL (DP vote, ALL points)
    prefill_any_attempt_interval: int      # DEEPINFER_PREFILL_ANY_ATTEMPT_INTERVAL (DP vote, ANY points)
    logging_interval_step: int             # DEEPINFER_LOGGING_INTERVAL_STEP (0 = off)
    kernels: KernelEnvs                    # the kernels package's knobs (deepinfer_kernels/envs.py), checked
                                           #   here so a bad value fails at engine start

    @classmethod
    def from_environ(cls) -> Envs:
        nextn = _int("DEEPINFER_USE_NEXTN_DECODE", 5, minimum=0)
        return cls(
            use_nextn_decode=nextn,
            enable_mtp_varlen=env_flag("DEEPINFER_ENABLE_MTP_VARLEN", False),
            max_backtracking_tokens=max(_int("DEEPINFER_MAX_BACKTRACKING_TOKENS", nextn + 1, 0), nextn + 1),
            yoco_prefill_keep_tokens=_int("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", 0, minimum=0),
            zero_overhead_scheduling=env_flag("DEEPINFER_ZERO_OVERHEAD_SCHEDULING", True),
            cudagraph_batch_size_interval=_int("DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL", 8, minimum=1),
            compile_decode=env_flag("DEEPINFER_COMPILE_DECODE", False),
            compile_speculation=env_flag("DEEPINFER_COMPILE_SPECULATION", False),
            batch_invariant=env_flag("DEEPINFER_BATCH_INVARIANT", False),
            decode_streams=env_flag("DEEPINFER_DECODE_STREAMS", True),
            confidence_head_temperature=_floats("DEEPINFER_DFLASH_CONFIDENCE_HEAD_TEMPERATURE"),
            prefill_attempt_interval=_int("DEEPINFER_PREFILL_ATTEMPT_INTERVAL", 70, minimum=1),
            prefill_any_attempt_interval=_int("DEEPINFER_PREFILL_ANY_ATTEMPT_INTERVAL", 100, minimum=1),
            logging_interval_step=_int("DEEPINFER_LOGGING_INTERVAL_STEP", 0, minimum=0),
            kernels=KernelEnvs.from_environ(),
        )

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
