"""GPU: a one-row decode step (batch 1, no drafts) runs its projections through the matrix-vector
kernel (`deepinfer_kernels.ops.linear`), and its logits, DSpark features and next tokens agree with
the same steps run through cuBLAS (`DEEPINFER_MATVEC=0`'s path) to bf16 accuracy."""

import pytest
import torch

import deepinfer_kernels.ops.linear as linear_op
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import tiny
from deepinfer_model.testing import Driver, Seq, clone_cache


def require_sm90() -> None:
    from deepinfer_kernels.platform import current_platform
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if not current_platform().is_sm90:
        pytest.skip("the matrix-vector kernel is built for SM90")


def prefilled(model: V41ForCausalLM, prompt_len: int, seed: int) -> tuple[Driver, Seq]:
    """A random prompt of `prompt_len` tokens prefilled in 8-token blocks, its greedy token appended."""
    g = torch.Generator().manual_seed(seed)
    seq = Seq(torch.randint(4, 8192, (prompt_len,), generator=g).tolist(), prompt_len)
    drv = Driver(model, num_blocks=32, block_size=8)
    _, out = drv.prefill([seq], [seq.prompt_len])
    seq.tokens.append(int(out.logits[-1].argmax()))
    return drv, seq


@pytest.mark.gpu
@torch.no_grad()
def test_one_row_steps_take_the_matvec_kernel_and_match_cublas(monkeypatch):
    require_sm90()
    model = V41ForCausalLM(tiny(), device=torch.device("cuda")).init_random_weights(0).eval()   # bf16
    drv, seq = prefilled(model, 37, seed=0)

    kernel_rows = []
    pick = linear_op._one_row_kernel

    def counting_pick(x, weight):
        kernel = pick(x, weight)
        if kernel is not None:
            kernel_rows.append(tuple(weight.shape))
        return kernel

    monkeypatch.setattr(linear_op, "_one_row_kernel", counting_pick)
    agree = 0
    for step in range(8):
        meta = drv.decode_meta([seq], [[]], features=True)
        cublas_cache = clone_cache(drv.cache)
        monkeypatch.setattr(linear_op, "MATVEC_ENABLED", False)
        before = len(kernel_rows)
        ref = model.forward(meta, cublas_cache)
        assert len(kernel_rows) == before, "the switch off must keep every projection on cuBLAS"
        monkeypatch.setattr(linear_op, "MATVEC_ENABLED", True)
        got = model.forward(meta, drv.cache)
        torch.cuda.synchronize()
        assert len(kernel_rows) > before, f"step {step}: no projection took the matrix-vector kernel"
        scale = ref.logits.float().abs().max().item()
        assert (got.logits.float() - ref.logits.float()).abs().max().item() <= 0.05 * scale + 0.05, step
        torch.testing.assert_close(got.dspark_features.float(), ref.dspark_features.float(), atol=0.1, rtol=0.05)
        token = int(got.logits[0].argmax())
        agree += token == int(ref.logits[0].argmax())
        seq.tokens.append(token)
    assert agree >= 7, f"greedy tokens agreed on {agree} of 8 steps"
    # Every projection the step multiplies by takes the kernel: at least q, kv, o and the FFN's per layer.
    assert len(set(kernel_rows)) >= 4, sorted(set(kernel_rows))


@pytest.mark.gpu
@torch.no_grad()
def test_one_row_norm_and_projection_in_one_launch_is_bit_identical(monkeypatch):
    """A layer's input norm and fused input projection, the q latent's norm before q_b and the
    indexer's query, and the post-attention add + norm before the MoE input projection, each in one
    launch at batch 1 (`rms_norm_linear`): a decode step's logits equal those of the same step with
    the norms as launches of their own, bit for bit; so does the final norm + lm_head, whose kernel
    writes the float32 logits itself."""
    import deepinfer_model.modules.norm as norm_module
    require_sm90()
    # bf16, with the float32 norm weights the engine keeps (`keep_float32_params`): the norms the
    # one-launch path computes; with bf16 norm weights every norm stays a launch of its own
    model = V41ForCausalLM(tiny(), device=torch.device("cuda")).init_random_weights(0).eval().keep_float32_params()
    drv, seq = prefilled(model, 45, seed=1)
    fused_calls = []
    fused_op = norm_module.rms_norm_linear

    def counting(*args, **kwargs):
        fused_calls.append(tuple(args[3].shape))
        return fused_op(*args, **kwargs)

    for step in range(4):
        meta = drv.decode_meta([seq], [[]])
        two_ops_cache = clone_cache(drv.cache)
        monkeypatch.setattr(norm_module, "rms_norm_linear", linear_op.rms_norm_linear_ref)
        ref = model.forward(meta, two_ops_cache)
        monkeypatch.setattr(norm_module, "rms_norm_linear", counting)
        got = model.forward(meta, drv.cache)
        torch.cuda.synchronize()
        assert fused_calls, "no norm + projection took the one-launch path"
        assert tuple(model.lm_head.weight.shape) in fused_calls, "the final norm + lm_head (float32 logits)"
        assert torch.equal(got.logits, ref.logits), step
        seq.tokens.append(int(got.logits[0].argmax()))
