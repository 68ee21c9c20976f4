"""TileLang kernels of the verification/RNG ops vs their torch references (CUDA + TileLang only)."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.sampling.rng import RngStream, counter_uniform_ref, counter_uniform_tilelang
from deepinfer_kernels.ops.verification.accept import get_accept_result_ref, get_accept_result_tilelang
from deepinfer_kernels.ops.verification.finalize import (
    finalize_verification_ref,
    finalize_verification_tilelang,
)
from deepinfer_kernels.ops.verification.metadata import (
    prepare_verification_metadata_ref,
    prepare_verification_metadata_tilelang,
)
from deepinfer_kernels.platform import Backend, current_platform, select_backend

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _needs_tilelang():
    pytest.importorskip("tilelang")


def layout(seqlens: list[int]):
    s = torch.tensor(seqlens, dtype=torch.int32, device=CUDA)
    return (torch.cumsum(s, 0) - s).to(torch.int32), s, int(s.sum())


CASES = {
    "ragged": lambda g: torch.randint(1, 7, (300,), generator=g).tolist(),
    "many-blocks": lambda g: torch.randint(1, 7, (4099,), generator=g).tolist(),
    "no-drafts": lambda g: [1] * 257,
    "single": lambda g: [6],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("accept_rate", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("draft_dtype", [torch.int32, torch.int64])
def test_verification_kernels_match_references(case, accept_rate, draft_dtype):
    g = torch.Generator().manual_seed(list(CASES).index(case) * 10 + int(accept_rate * 10))
    ftp, s, total_q = layout(CASES[case](g))
    ref = prepare_verification_metadata_ref(ftp, s, total_q)
    got = prepare_verification_metadata_tilelang(ftp, s, total_q)
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)
    row_to_req, _, is_verify = ref
    raw = (torch.rand(total_q, generator=g) < accept_rate).to(CUDA)
    eff_ref, fin_ref = get_accept_result_ref(raw, is_verify, ftp, row_to_req)
    eff, fin = get_accept_result_tilelang(raw, is_verify, ftp)
    assert torch.equal(eff, eff_ref) and torch.equal(fin, fin_ref)
    drafts = torch.randint(0, 1 << 17, (total_q,), generator=g).to(draft_dtype).to(CUDA)
    want = finalize_verification_ref(eff_ref, fin_ref, is_verify, drafts, ftp, row_to_req)
    have = finalize_verification_tilelang(eff_ref, fin_ref, is_verify, drafts, ftp)
    for name in ("final_row", "last_valid_offset", "num_accepted", "num_verified", "verified_token_ids"):
        assert torch.equal(getattr(want, name), getattr(have, name)), name


def test_counter_uniform_kernel_bit_identical_to_reference_and_cpu():
    g = torch.Generator().manual_seed(0)
    n = 100_003
    seeds = torch.randint(-(1 << 62), 1 << 62, (n,), generator=g)
    pos = torch.randint(0, 1 << 40, (n,), generator=g)
    streams = torch.randint(0, len(RngStream), (n,), generator=g)
    cpu = counter_uniform_ref(seeds, pos, streams)
    got = counter_uniform_tilelang(seeds.to(CUDA), pos.to(CUDA), streams.to(CUDA)).cpu()
    assert torch.equal(got, cpu)


def test_dispatch_selects_the_kernels_on_sm90():
    plat = current_platform()
    expected = Backend.TILELANG if plat.is_sm90 else Backend.TORCH
    for op in ("prepare_verification_metadata", "get_accept_result", "finalize_verification", "counter_uniform"):
        assert select_backend(op, CUDA, has_kernel=True) is expected
