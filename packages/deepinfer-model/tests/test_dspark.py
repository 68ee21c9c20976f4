"""DSpark engine path vs the dense reference: main-token keys from target features, draft block,
Markov and confidence heads (greedy and with given uniforms)."""


import pytest
import torch

from deepinfer_model.testing import Driver, Seq, tiny_model

ATOL = 5e-2  # same budget as the target logits (an FP8 rounding flip; see test_engine_matches_reference)


def _compare(model, drv, seqs, mains, uniforms=None):
    dm = drv.draft_meta(seqs, mains)
    got = model.dspark_draft(dm, drv.cache, uniforms)
    n = model.config.nextn
    assert got.token_ids.shape == (len(seqs), n) and got.confidence.shape == (len(seqs), n)
    assert bool(((got.confidence > 0) & (got.confidence < 1)).all())
    torch.testing.assert_close(got.probs.sum(-1), torch.ones(len(seqs), n))
    for i, (s, m) in enumerate(zip(seqs, mains, strict=False)):
        want = model.reference_draft(torch.tensor(s.tokens), m, prompt_len=s.prompt_len, kv_quant=True,
                                     uniforms=None if uniforms is None else uniforms[i])
        n_same, n_tok = n, n
        if uniforms is not None:
            # Inverse-CDF sampling: a uniform within float noise of a CDF boundary may pick the
            # neighbouring token; later positions then condition on another Markov token.
            diff = (got.token_ids[i] != want.token_ids[0]).nonzero()
            if diff.numel():
                j = int(diff[0])
                cdf = want.probs[0, j].cumsum(-1)
                t = int(want.token_ids[0, j])
                u = float(uniforms[i, j]) * float(cdf[-1])
                assert min(abs(u - float(cdf[t])), abs(u - float(cdf[t - 1]))) < 1e-3, "not a boundary case"
                n_same, n_tok = j + 1, j      # logits of position j still agree, its token may not
        assert got.token_ids[i, :n_tok].tolist() == want.token_ids[0, :n_tok].tolist()
        assert (got.logits[i, :n_same] - want.logits[0, :n_same]).abs().max().item() <= ATOL
        torch.testing.assert_close(got.confidence[i, :n_same], want.confidence[0, :n_same], rtol=0, atol=5e-3)
    return got


def test_draft_after_prefill_and_decode_steps_matches_reference():
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    seqs = [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in (40, 7, 23)]
    drv = Driver(model, num_blocks=48, block_size=8)
    meta, out = drv.prefill(seqs, [s.prompt_len for s in seqs], features=True)
    model.dspark_write_main_keys(meta, out, drv.cache)
    mains = [int(x) for x in out.logits.argmax(-1)]
    _compare(model, drv, seqs, mains)
    for s, m in zip(seqs, mains, strict=False):
        s.tokens.append(m)
    for step in range(3):
        # verify two garbage drafts (rejected), written optimistically, then overwritten next step
        meta, out = drv.decode(seqs, [[11, 12] for _ in seqs], features=True)
        model.dspark_write_main_keys(meta, out, drv.cache)
        mains = [int(out.logits[3 * i].argmax()) for i in range(len(seqs))]
        # the rejected rows' main keys sit at positions > p and are never read by this draft
        uniforms = torch.rand(len(seqs), model.config.nextn, generator=g) if step == 2 else None
        got = _compare(model, drv, seqs, mains, uniforms)
        for s, m in zip(seqs, mains, strict=False):
            s.tokens.append(m)
    assert got.token_ids.dtype == torch.long


def test_sampling_with_uniforms_follows_the_cdf():
    model = tiny_model()
    ds = model.model.dspark
    h = torch.randn(2, ds.nextn, model.config.hidden_size)
    main = torch.tensor([5, 6])
    zero = ds.heads(h, model.lm_head.weight, main, torch.zeros(2, ds.nextn))
    top = ds.heads(h, model.lm_head.weight, main, torch.full((2, ds.nextn), 1 - 1e-7))
    # u -> token = first index whose inclusive CDF exceeds u * total
    for out, u in ((zero, 0.0), (top, 1 - 1e-7)):
        for r in range(2):
            cdf = out.probs[r, 0].cumsum(-1)
            assert int(out.token_ids[r, 0]) == int((cdf > u * cdf[-1]).nonzero()[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_main_keys_of_all_layers_at_once_are_bit_identical(dtype):
    """`main_keys_all` (the engine's write of every DFlash layer's main key in a few kernels) equals
    each layer's `main_keys` bit for bit, with the model's parameters as loaded and with the
    float32 copies the engine keeps (`keep_float32_params`)."""
    from deepinfer_model import presets
    from deepinfer_model.model import V41ForCausalLM
    from deepinfer_model.modules.rope import rope_table

    model = V41ForCausalLM(presets.default(), dtype=dtype).init_random_weights(3)
    f = torch.randn(37, model.config.hidden_size).to(dtype)
    rope = rope_table(torch.randint(0, 1000, (37,)), model.config.qk_rope_head_dim, model.config.rope_theta)
    ds = model.model.dspark
    want = torch.stack([layer.main_keys(f, rope) for layer in ds.layers])
    assert torch.equal(ds.main_keys_all(f, rope), want)
    model.keep_float32_params()
    assert ds.layers[0].input_layernorm.weight.dtype == torch.float32
    assert model.model.dspark.confidence_head.weight.dtype == torch.float32
    assert model.lm_head.weight.dtype == dtype                        # the matmul weights keep theirs
    assert torch.equal(ds.main_keys_all(f, rope), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_and_latent_with_one_rope_are_bit_identical(dtype):
    """`MLAAttention.query_and_latent` (one RoPE for the query heads and the KV head) equals `query`
    and `latent` called separately, bit for bit."""
    from deepinfer_model import presets
    from deepinfer_model.model import V41ForCausalLM
    from deepinfer_model.modules.rope import rope_table

    model = V41ForCausalLM(presets.default(), dtype=dtype).init_random_weights(4)
    attn = model.model.layers[2].self_attn
    u = torch.randn(23, model.config.hidden_size).to(dtype)
    rope = rope_table(torch.randint(0, 3000, (23,)), attn.rope_dim, attn.theta)
    q, q_lat, latent = attn.query_and_latent(u, rope)
    want_q, want_lat = attn.query(u, rope)
    assert torch.equal(q, want_q) and torch.equal(q_lat, want_lat) and torch.equal(latent, attn.latent(u, rope))
