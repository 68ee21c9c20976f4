"""DEEPINFER_* knobs of the kernels package, parsed strictly in one place.

The ops read their knob when they run (a test or an A/B tool may change it between calls), and
two are read once per process when their module is imported (``DEEPINFER_MATVEC``,
``DEEPINFER_TILELANG_PDL``). ``KernelEnvs.from_environ()`` reads them all at once: the engine
calls it at start, so a misspelt value fails there, naming the variable and what it accepts,
instead of in the first prefill step. Flags take 1 / true / yes / on and 0 / false / no / off,
as the engine's knobs do ("false" used to read as on for two of them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KERNEL_BACKEND_ENV = "DEEPINFER_KERNEL_BACKEND"
SPARSE_MLA_VARIANT_ENV = "DEEPINFER_SPARSE_MLA_VARIANT"
SPARSE_MLA_SHARED_KEYS_ENV = "DEEPINFER_SPARSE_MLA_SHARED_KEYS"
SPARSE_MLA_GROUP_ROWS_ENV = "DEEPINFER_SPARSE_MLA_GROUP_ROWS"
MATVEC_ENV = "DEEPINFER_MATVEC"
TILELANG_PDL_ENV = "DEEPINFER_TILELANG_PDL"
MOE_GATEUP_WS_ENV = "DEEPINFER_MOE_GATEUP_WS"


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """``$name`` (lower-cased, ``default`` when unset or empty), one of ``choices``."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(repr(c) for c in choices)}")
    return value


FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def env_flag(name: str, default: bool) -> bool:
    """``$name`` as a flag (``default`` when unset or empty)."""
    return FLAG_VALUES[env_choice(name, "1" if default else "0", tuple(FLAG_VALUES))]


BACKEND_CHOICES = ("", "torch", "tilelang")       # "": per device (``platform.Backend`` values)
SPARSE_MLA_KERNEL_VARIANTS = ("auto", "ws", "bulk", "mma")


def kernel_backend() -> str:
    """``$DEEPINFER_KERNEL_BACKEND``: "" (each op picks per device), "torch" or "tilelang"."""
    return env_choice(KERNEL_BACKEND_ENV, "", BACKEND_CHOICES)


def kernel_variant() -> str:
    """The TileLang kernel ``$DEEPINFER_SPARSE_MLA_VARIANT`` asks for ("auto" when unset)."""
    return env_choice(SPARSE_MLA_VARIANT_ENV, "auto", SPARSE_MLA_KERNEL_VARIANTS)


def shared_key_group_rows() -> int:
    """``$DEEPINFER_SPARSE_MLA_GROUP_ROWS`` ("4" when unset): how many consecutive rows share a key
    list when shared keys are asked for. 4: quads of 16 heads (the queries fill the wgmma's M of 64,
    ``tilelang/sparse_mla/quads.py``; 1.3x the pairs on `mini`'s prefill rows, H200 2026-12-01),
    pairs where a quad does not apply (other head counts, rows wider than 480 columns). 2: pairs
    only (``tilelang/sparse_mla/groups.py``)."""
    return int(env_choice(SPARSE_MLA_GROUP_ROWS_ENV, "4", ("2", "4")))


def shared_keys_enabled() -> bool:
    """``$DEEPINFER_SPARSE_MLA_SHARED_KEYS`` ("1" when unset): whether the model asks for shared keys
    (``sparse_mla_attention(..., shared_keys=True)``) in its prefill chunks. "0" keeps every row on
    the per-row kernels (the A/B switch of ``tools/gpu_engine_check.sh sharedkeys``)."""
    return env_flag(SPARSE_MLA_SHARED_KEYS_ENV, True)


@dataclass(frozen=True)
class KernelEnvs:
    kernel_backend: str            # DEEPINFER_KERNEL_BACKEND: "" (per device) | "tilelang" | "torch"
    sparse_mla_variant: str        # DEEPINFER_SPARSE_MLA_VARIANT: auto | ws | bulk | mma
    sparse_mla_shared_keys: bool   # DEEPINFER_SPARSE_MLA_SHARED_KEYS: prefill row groups share key lists (1)
    sparse_mla_group_rows: int     # DEEPINFER_SPARSE_MLA_GROUP_ROWS: 4 (quads, the default) | 2 (pairs)
    matvec: bool                   # DEEPINFER_MATVEC: one-row projections as matrix-vector kernels (1)
    tilelang_pdl: bool             # DEEPINFER_TILELANG_PDL: programmatic dependent launch (0)
    moe_gateup_ws: bool            # DEEPINFER_MOE_GATEUP_WS: warp-specialized prefill gate/up tiles (0)

    @classmethod
    def from_environ(cls) -> KernelEnvs:
        return cls(
            kernel_backend=kernel_backend(),
            sparse_mla_variant=kernel_variant(),
            sparse_mla_shared_keys=shared_keys_enabled(),
            sparse_mla_group_rows=shared_key_group_rows(),
            matvec=env_flag(MATVEC_ENV, True),
            tilelang_pdl=env_flag(TILELANG_PDL_ENV, False),
            moe_gateup_ws=env_flag(MOE_GATEUP_WS_ENV, False),
        )
