"""Every TileLang kernel of the sampling/verification ops lowers to CUDA (no GPU needed).

Runs where TileLang is installed (the `cuda` extra); skipped otherwise. It catches front-end,
type and layout-inference errors and pins key lines of the emitted CUDA; whether the kernels
compute the right values is checked against the references by the `gpu` tests.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tilelang")

from deepinfer_kernels.ops.sampling._tilelang import lower_to_cuda_source  # noqa: E402
from deepinfer_kernels.ops.sampling.rng import counter_uniform_kernel  # noqa: E402
from deepinfer_kernels.ops.verification.accept import get_accept_result_kernel  # noqa: E402
from deepinfer_kernels.ops.verification.finalize import finalize_verification_kernel  # noqa: E402
from deepinfer_kernels.ops.verification.metadata import prepare_verification_metadata_kernel  # noqa: E402


def test_counter_uniform_kernel_uses_uint64_splitmix():
    src = lower_to_cuda_source(counter_uniform_kernel)
    assert "__global__" in src and "uint64_t" in src
    for signed_constant in ("-7046029254386353131", "-4658895280553007687", "-7723592293110705685"):
        assert signed_constant in src  # GAMMA, MUL1, MUL2 as int64 bit patterns
    assert "0x1p-53" in src


def test_verification_kernels_lower():
    for factory, args in ((prepare_verification_metadata_kernel, ()), (get_accept_result_kernel, ()),
                          (finalize_verification_kernel, ("int32",)), (finalize_verification_kernel, ("int64",))):
        src = lower_to_cuda_source(factory, *args)
        assert "__global__" in src and "req_cnt" in src, factory.__name__
    assert "-1" in lower_to_cuda_source(finalize_verification_kernel, "int32")  # VERIFIED_END
