"""deepinfer_kernels: GPU ops (TileLang, SM90) with torch references that are also the CPU path."""

from deepinfer_kernels.platform import Backend, Platform, PlatformKind, current_platform, select_backend

__version__ = "0.1.22"
__all__ = ["Backend", "Platform", "PlatformKind", "current_platform", "select_backend", "__version__"]
