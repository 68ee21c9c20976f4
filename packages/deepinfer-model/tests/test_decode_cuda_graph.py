"""GPU: the decode step captured in CUDA graphs replays exactly like eager.

Graph 1: decode forward + DSpark main-key write over static ForwardMetadata buffers (a bucket
of BUCKET_ROWS rows and BUCKET_ROWS + 1 requests, `pad_decode` contract). Graph 2: the draft
forward over static DraftMetadata / uniforms / greedy buffers. Two different batches (other
requests, row counts, draft counts, contexts) are copied into the same buffers; after each
replay the outputs and every cache tensor equal an eager run of the same padded batch on a
copy of the cache taken before the replay.
"""

import pytest
import torch

from deepinfer_model.metadata import DraftMetadata, ForwardMetadata
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import tiny
from deepinfer_model.testing import Driver, Seq, caches_equal, clone_cache

BUCKET_ROWS = 32
MAX_BLOCKS = 16


def _copy_into(static, new) -> None:
    for name, v in vars(new).items():
        if isinstance(v, torch.Tensor):
            getattr(static, name).copy_(v)
        else:
            assert getattr(static, name) == v, f"{name}: a captured graph needs the same value"


@pytest.mark.gpu
@torch.no_grad()
def test_decode_step_cuda_graph_replay_equals_eager():
    from deepinfer_kernels.platform import current_platform
    if not current_platform().is_sm90:
        pytest.skip("the capturable MoE path (torch._grouped_mm) runs on SM90")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = V41ForCausalLM(tiny(), device=dev).init_random_weights(0).eval()      # bf16
    nextn = model.config.nextn
    g = torch.Generator().manual_seed(0)
    seqs = [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in (40, 9, 23, 17, 30, 5, 61)]
    drv = Driver(model, num_blocks=96, block_size=8)
    meta, out = drv.prefill(seqs, [s.prompt_len for s in seqs], features=True)
    model.dspark_write_main_keys(meta, out, drv.cache)
    for s, t in zip(seqs, out.logits.argmax(-1).tolist(), strict=True):
        s.tokens.append(t)

    def batch(idx, drafts):
        ss = [seqs[i] for i in idx]
        m = drv.decode_meta(ss, [[int(t) for t in torch.randint(4, 8192, (d,), generator=g)] for d in drafts],
                            features=True, max_blocks=MAX_BLOCKS)
        dm = drv.draft_meta(ss, torch.randint(4, 8192, (len(ss),), generator=g).tolist(), max_blocks=MAX_BLOCKS)
        uni = torch.rand(BUCKET_ROWS + 1, nextn, generator=g).to(dev)
        greedy = (torch.rand(BUCKET_ROWS + 1, generator=g) < 0.5).to(dev)
        return m.pad_decode(BUCKET_ROWS), dm.pad(BUCKET_ROWS + 1), uni, greedy

    batches = [batch([0, 1, 2, 3, 4], [1, 0, 3, 2, 0]), batch([6, 5, 3, 2, 1, 0, 4], [0, 2, 5, 1, 1, 0, 3])]
    m0, dm0, uni0, greedy0 = batches[0]                       # static buffers: private copies
    s_meta = ForwardMetadata(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(m0).items()})
    s_dmeta = DraftMetadata(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(dm0).items()})
    s_uni, s_greedy = uni0.clone(), greedy0.clone()
    cache = drv.cache

    def fwd():
        o = model.forward(s_meta, cache)
        model.dspark_write_main_keys(s_meta, o, cache)
        return o

    def draft():
        return model.dspark_draft(s_dmeta, cache, s_uni, s_greedy)

    # warm-up (lazy inits, allocator) on a side stream; writes are idempotent per slot
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fwd()
            draft()
    torch.cuda.current_stream().wait_stream(side)
    g_fwd, g_draft = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_fwd):
        s_out = fwd()
    with torch.cuda.graph(g_draft, pool=g_fwd.pool()):
        s_draft = draft()

    for m, dm, uni, greedy in batches:
        _copy_into(s_meta, m)
        _copy_into(s_dmeta, dm)
        s_uni.copy_(uni)
        s_greedy.copy_(greedy)
        eager_cache = clone_cache(cache)
        g_fwd.replay()
        g_draft.replay()
        e_out = model.forward(m, eager_cache)
        model.dspark_write_main_keys(m, e_out, eager_cache)
        e_draft = model.dspark_draft(dm, eager_cache, uni, greedy)
        torch.cuda.synchronize()
        assert torch.equal(s_out.logits, e_out.logits)
        assert torch.equal(s_out.dspark_features, e_out.dspark_features)
        assert bool(s_out.logits.isfinite().all())
        for f in ("token_ids", "logits", "probs", "confidence"):
            assert torch.equal(getattr(s_draft, f), getattr(e_draft, f)), f
        assert caches_equal(cache, eager_cache)
