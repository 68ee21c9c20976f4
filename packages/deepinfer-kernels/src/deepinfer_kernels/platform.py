"""The single place that detects the accelerator and picks a backend for every op.

Detection order: CUDA compute capability through cuda-python (``cuda.bindings``) where it is
installed, else through torch; no CUDA device means the CPU. Ops never probe the device
themselves: they call :func:`select_backend` with the device of their inputs.

``DEEPINFER_KERNEL_BACKEND=torch`` forces the torch references everywhere (debugging, A/B
measurements). SM100 and Ascend are recognised as platform kinds so their backends can be added
here, but nothing dispatches to code that does not exist.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass

import torch

from deepinfer_kernels.envs import BACKEND_CHOICES, kernel_backend  # noqa: F401  (BACKEND_CHOICES: the knob's values)


class Backend(enum.Enum):
    TORCH = "torch"        # the <op>_ref torch implementation: CPU path and oracle
    TILELANG = "tilelang"  # TileLang CUDA kernel (SM90)


class PlatformKind(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True)
class Platform:
    kind: PlatformKind
    device_name: str
    compute_capability: tuple[int, int] | None  # (major, minor) on CUDA, None on the CPU
    has_tilelang: bool                           # tilelang importable (not imported yet)

    @property
    def is_cuda(self) -> bool:
        return self.kind is PlatformKind.CUDA

    @property
    def is_sm90(self) -> bool:
        return self.compute_capability == (9, 0)


def _capability_from_cuda_python() -> tuple[str, tuple[int, int]] | None:
    """Compute capability of device 0 via cuda-python's runtime bindings, if installed."""
    if importlib.util.find_spec("cuda") is None:
        return None
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        return None
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count == 0:
        return None
    err, props = cudart.cudaGetDeviceProperties(0)
    if int(err) != 0:
        return None
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    return name.rstrip("\x00"), (int(props.major), int(props.minor))


def _capability_from_torch() -> tuple[str, tuple[int, int]] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))


_detected: Platform | None = None   # a plain global, not lru_cache: dynamo reads it without tracing detection


def current_platform() -> Platform:
    """Detect once per process (`detect_platform()`)."""
    global _detected
    if _detected is None:
        _detected = detect_platform()
    return _detected


def detect_platform() -> Platform:
    found = _capability_from_cuda_python() or _capability_from_torch()
    has_tilelang = importlib.util.find_spec("tilelang") is not None
    if found is None or not torch.cuda.is_available():
        return Platform(PlatformKind.CPU, "cpu", None, has_tilelang)
    name, capability = found
    return Platform(PlatformKind.CUDA, name, capability, has_tilelang)


# DEEPINFER_KERNEL_BACKEND's values are a constant in envs (BACKEND_CHOICES): `forced_backend`
# runs inside torch.compile'd steps, and torch 2.11's dynamo cannot iterate an Enum class there.
def forced_backend() -> Backend | None:
    value = kernel_backend()
    return Backend(value) if value else None


# ops whose TileLang kernel is wrapped as a torch custom op (tilelang/torch_ops.py): the only ones
# that stay TileLang under torch.compile; inductor generates the code of every other op.
CUSTOM_OP_KERNELS = frozenset({"sparse_mla_attention", "store_kv_fp8", "store_index_k_fp4", "indexer_scores",
                               "indexer_topk_blocks", "routed_experts"})


def select_backend(op_name: str, device: torch.device, has_kernel: bool = True) -> Backend:
    """Backend for one call of ``op_name`` on tensors living on ``device``.

    TileLang is chosen only for CUDA tensors on SM90 with TileLang installed and an existing
    kernel for the op (``has_kernel``); everything else runs the torch reference. While dynamo
    traces, only the ops of ``CUSTOM_OP_KERNELS`` keep their kernel.
    """
    forced = forced_backend()
    if forced is Backend.TORCH or device.type != "cuda":
        return Backend.TORCH
    if torch.compiler.is_compiling() and op_name not in CUSTOM_OP_KERNELS:
        return Backend.TORCH
    plat = current_platform()
    usable = has_kernel and plat.has_tilelang and plat.is_sm90
    if forced is Backend.TILELANG and not usable:
        raise RuntimeError(
            f"{op_name}: DEEPINFER_KERNEL_BACKEND=tilelang but no TileLang kernel can run here "
            f"(platform {plat.device_name}, capability {plat.compute_capability}, "
            f"tilelang installed: {plat.has_tilelang}, kernel exists: {has_kernel})"
        )
    return Backend.TILELANG if usable else Backend.TORCH


# CUDA's limit on a grid's y extent: kernels that put one row per grid row on y (the slot lookups,
# attention_indices) take the torch path above it (a prefill step of more rows) instead of failing
# to launch
MAX_GRID_Y = 65535


def tilelang_launcher(op_name: str, device: torch.device, supported: bool = True):
    """The op's TileLang launcher when `select_backend` picks TileLang for it, else None.

    `supported`: the call's operands are ones the kernel handles (dtype, alignment); otherwise the
    torch reference runs. Ops without a launcher (`deepinfer_kernels.tilelang.LAUNCHERS`) never pick it.
    """
    from deepinfer_kernels.tilelang import LAUNCHERS, get_launcher

    has_kernel = supported and op_name in LAUNCHERS
    if select_backend(op_name, device, has_kernel=has_kernel) is not Backend.TILELANG:
        return None
    if torch.compiler.is_compiling():  # dynamo traces: the kernel as an opaque custom op
        from deepinfer_kernels.tilelang.torch_ops import COMPILED_LAUNCHERS

        return COMPILED_LAUNCHERS[op_name]   # select_backend picked TileLang: op_name in CUSTOM_OP_KERNELS
    return get_launcher(op_name)
