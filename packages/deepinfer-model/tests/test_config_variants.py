"""Optional paths of the architecture: YOCO off, no DSpark / Engram / sharing, tied embeddings,
all-MoE. The engine path must still match the reference, and the reference must be trainable."""

import torch

from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import tiny
from deepinfer_model.testing import Driver, Seq

VARIANTS = {
    "yoco_off": dict(compress_ratios=(0, 4, 4, 2, 0, 2, 2), kv_source_layer_ids=(1, 3, 5),
                     dspark_target_layer_ids=(1, 6)),
    "bare": dict(nextn=0, engram_layer_ids=(), kv_source_layer_ids=(), first_k_dense_replace=0,
                 tie_word_embeddings=True),
}


def _run(cfg, seed=0):
    model = V41ForCausalLM(cfg).init_random_weights(seed).eval()
    g = torch.Generator().manual_seed(seed)
    seqs = [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in (37, 12)]
    drv = Driver(model, num_blocks=32, block_size=8)
    drv.prefill(seqs, [10, 12])          # seq 1 finishes here, seq 0 is chunked
    drv.prefill(seqs[:1], [27])
    logits: dict[int, list] = {}
    for s in seqs:
        s.tokens.append(7)
    for _ in range(4):
        _, out = drv.decode(seqs, [[], []])
        for i, s in enumerate(seqs):
            logits.setdefault(i, []).append(out.logits[i])
            s.tokens.append(int(out.logits[i].argmax()))
    for i, s in enumerate(seqs):
        ref = model.reference_forward(torch.tensor(s.tokens[:-1]), mode="bounded_replay",
                                      prompt_len=s.prompt_len, kv_quant=True)
        steps = logits[i][-4:]
        for k, lg in enumerate(steps):
            want = ref.logits[s.prompt_len + k - ref.logit_start]
            assert (lg - want).abs().max() < 5e-2
            assert int(lg.argmax()) == int(want.argmax())
    return model


def test_yoco_off_engine_matches_reference():
    cfg = tiny().replace(**VARIANTS["yoco_off"])
    assert not cfg.topology.yoco_enabled
    _run(cfg)


def test_bare_config_engine_matches_reference():
    cfg = tiny().replace(**VARIANTS["bare"])
    model = _run(cfg)
    assert model.model.dspark is None and model.lm_head.weight is model.model.embed_tokens.weight


def test_reference_forward_is_differentiable():
    model = V41ForCausalLM(tiny()).init_random_weights(0)
    toks = torch.randint(4, 8192, (24,))
    out = model.reference_forward(toks, enable_grad=True, return_dspark_features=True)
    loss = torch.nn.functional.cross_entropy(out.logits[:-1], toks[1:]) + out.dspark_features.square().mean()
    loss.backward()
    assert model.lm_head.weight.grad is not None
    assert model.model.layers[1].self_attn.compressor.wkv.weight.grad.abs().sum() > 0
    assert model.model.layers[5].self_attn.compressor.wkv.weight.grad.abs().sum() > 0
