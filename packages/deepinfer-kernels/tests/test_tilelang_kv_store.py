"""GPU tests: TileLang fused quantize + scatter vs the FP8 / FP4 references (bit-exact)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

kv_fp8 = pytest.importorskip("deepinfer_kernels.ops.kv_fp8")
kv_fp4 = pytest.importorskip("deepinfer_kernels.ops.kv_fp4")


def _inputs(n, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    x[0] = 0.0                                   # amax == 0 group
    x[1, :32] = -0.0
    if n > 3:
        x[2] = x[2].sign() * 448.0 * 2.0 ** torch.randint(-8, 8, (d,), generator=g).float()  # exact powers
        x[3, ::2] = float(torch.finfo(torch.float32).tiny)
    return x.to(dtype).cuda()


def _check_store(ref, kernel, x, slot_map, slots: int, rec: int) -> None:
    """The kernel's store of x [n, D] into a random pool uint8 [slots, rec] equals the reference's,
    byte for byte (rows whose slot is -1 left as they were)."""
    pool = torch.randint(0, 256, (slots, rec), dtype=torch.uint8, device="cuda")
    want = pool.clone()
    ref(x, want, slot_map)
    kernel(x, pool, slot_map)
    torch.cuda.synchronize()
    assert torch.equal(pool, want)


@pytest.mark.parametrize("d", [512, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_store_kv_fp8_bit_exact(d, dtype, slot_dtype):
    from deepinfer_kernels.tilelang.kv_store import quantize_kv_fp8_tilelang, store_kv_fp8_tilelang

    n, slots = 300, 1000
    x = _inputs(n, d, dtype, d)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    rec = d + d // 32
    slot_map = torch.randperm(slots, device="cuda")[:n].to(slot_dtype)
    slot_map[::7] = -1
    _check_store(kv_fp8.store_kv_fp8_ref, store_kv_fp8_tilelang, x, slot_map, slots, rec)
    assert torch.equal(quantize_kv_fp8_tilelang(x), kv_fp8.quantize_kv_fp8_ref(x))


@pytest.mark.parametrize("n", [1, 7, 300])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_store_normed_kv_fp8_equals_norm_cat_store_bit_for_bit(n, slot_dtype):
    """The decode latent store in one launch (`mini` / flash: 448 normed + 64 RoPE values, read from
    the tail of a fused projection row) equals the TileLang norm, torch's cat and the TileLang store."""
    from deepinfer_kernels.tilelang.kv_store import store_kv_fp8_tilelang, store_normed_kv_fp8_tilelang
    from deepinfer_kernels.tilelang.norm import rms_norm_tilelang

    g = torch.Generator().manual_seed(n)
    fused = (torch.randn(n, 1000 + 512, generator=g) * 3).to(torch.bfloat16).cuda()
    kv = fused[:, 1000:]
    w = (torch.rand(448, generator=g) + 0.5).cuda()
    slots = torch.randperm(600, device="cuda")[:n].to(slot_dtype)
    slots[1::3] = -1
    pool = torch.randint(0, 256, (600, 528), dtype=torch.uint8, device="cuda")
    original, want, public = pool.clone(), pool.clone(), pool.clone()
    store_kv_fp8_tilelang(torch.cat([rms_norm_tilelang(kv[:, :448], w, 1e-6), kv[:, 448:]], -1), want, slots)
    store_normed_kv_fp8_tilelang(kv, w, 1e-6, 448, pool, slots)
    kv_fp8.store_normed_kv_fp8(kv, w, 1e-6, 448, public, slots)   # the public op: the kernel on SM90
    torch.cuda.synchronize()
    assert not torch.equal(want, original)                    # slot 0 of the mapping is stored
    assert torch.equal(pool, want) and torch.equal(public, want)


@pytest.mark.parametrize("n", [1, 7, 300])
def test_store_normed_kv_fp8_with_rope_equals_rope_then_store_bit_for_bit(n):
    """The decode latent's RoPE in the store's launch: the record equals `rope_inplace` of the
    64-value tail, then the normed store (two launches), bit for bit, and the fused row is not
    written (nothing reads its tail after the store)."""
    from deepinfer_kernels.ops.rope import rope_inplace
    from deepinfer_kernels.tilelang.kv_store import store_normed_kv_fp8_tilelang

    g = torch.Generator().manual_seed(100 + n)
    fused = (torch.randn(n, 1000 + 512, generator=g) * 3).to(torch.bfloat16).cuda()
    kv = fused[:, 1000:]
    w = (torch.rand(448, generator=g) + 0.5).cuda()
    ang = (torch.randint(0, 5000, (n, 1), generator=g).float() * torch.rand(1, 32, generator=g)).cuda()
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([-ang.sin(), ang.sin()], -1)
    slots = torch.randperm(600, device="cuda")[:n]
    slots[2::3] = -1
    pool = torch.randint(0, 256, (600, 528), dtype=torch.uint8, device="cuda")
    want, public = pool.clone(), pool.clone()
    before = fused.clone()
    tail = kv[:, 448:].clone().unsqueeze(1)   # a copy, rotated by the RoPE kernel
    rope_inplace(tail, cos, sin)
    store_normed_kv_fp8_tilelang(torch.cat([kv[:, :448], tail.squeeze(1)], -1), w, 1e-6, 448, want, slots)
    store_normed_kv_fp8_tilelang(kv, w, 1e-6, 448, pool, slots, rope=(cos, sin))
    kv_fp8.store_normed_kv_fp8(kv, w, 1e-6, 448, public, slots, rope=(cos, sin))   # the public op
    torch.cuda.synchronize()
    assert torch.equal(pool, want) and torch.equal(public, want)
    assert torch.equal(fused, before)
    unrotated = pool.clone()
    store_normed_kv_fp8_tilelang(kv, w, 1e-6, 448, unrotated, slots)
    assert not torch.equal(unrotated, pool)                   # the rotation reached the records


def test_stores_into_one_plane_of_a_planed_pool():
    """The engine passes one plane of a [planes, slots, rec] cache (a view at an offset): rows land
    in that plane only, bit-exact, and the other planes stay untouched."""
    from deepinfer_kernels.tilelang.kv_store import store_index_k_fp4_tilelang, store_kv_fp8_tilelang

    n, slots = 200, 700
    for store, ref, d, dtype in ((store_kv_fp8_tilelang, kv_fp8.store_kv_fp8_ref, 512, torch.bfloat16),
                                 (store_index_k_fp4_tilelang, kv_fp4.store_index_k_fp4_ref, 128, torch.float32)):
        x = _inputs(n, d, dtype, 11)
        rec = kv_fp8.fp8_record_bytes(d) if d == 512 else kv_fp4.fp4_record_bytes(d)
        slot_map = torch.randperm(slots, device="cuda")[:n]
        slot_map[::5] = -1
        pool = torch.randint(0, 256, (3, slots, rec), dtype=torch.uint8, device="cuda")
        want = pool.clone()
        ref(x, want[2], slot_map)
        store(x, pool[2], slot_map)
        torch.cuda.synchronize()
        assert torch.equal(pool, want)


@pytest.mark.parametrize("d", [128, 64, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_store_index_k_fp4_bit_exact(d, dtype):
    from deepinfer_kernels.tilelang.kv_store import quantize_index_k_fp4_tilelang, store_index_k_fp4_tilelang

    n, slots = 257, 600
    x = _inputs(n, d, dtype, d + 1)
    # exact e2m1 rounding ties (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) with amax 6 -> scale 2^0
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * (d // 8))
    x[4] = (ties * torch.where(torch.arange(d) % 3 == 0, -1.0, 1.0)).to(dtype).cuda()
    rec = d // 2 + d // 32
    slot_map = torch.randperm(slots, device="cuda")[:n]
    slot_map[1::5] = -1
    _check_store(kv_fp4.store_index_k_fp4_ref, store_index_k_fp4_tilelang, x, slot_map, slots, rec)
    assert torch.equal(quantize_index_k_fp4_tilelang(x), kv_fp4.quantize_index_k_fp4_ref(x))


def test_store_empty_and_all_skipped():
    from deepinfer_kernels.tilelang.kv_store import store_kv_fp8_tilelang

    pool = torch.zeros(10, 528, dtype=torch.uint8, device="cuda")
    store_kv_fp8_tilelang(torch.randn(0, 512, device="cuda"), pool, torch.empty(0, dtype=torch.long, device="cuda"))
    store_kv_fp8_tilelang(torch.randn(4, 512, device="cuda"), pool, torch.full((4,), -1, device="cuda"))
    torch.cuda.synchronize()
    assert bool((pool == 0).all())
