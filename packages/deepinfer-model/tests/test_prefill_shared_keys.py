"""A prefill chunk's row pairs attending their shared key lists (``sparse_mla_attention(...,
shared_keys=True)``, the quad or pair kernel), asked for by the model unless
``DEEPINFER_SPARSE_MLA_SHARED_KEYS=0``. CPU: the request is made (prefill only) or not, as the
variable says. GPU: on the model's real index lists (window-only and window + far-entry layers)
every call equals the per-row kernels' result on the same inputs."""

import pytest
import torch

from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import mini, tiny
from deepinfer_model.testing import Driver, Seq


@pytest.mark.parametrize("env,want", [(None, True), ("0", False), ("1", True)])
@torch.no_grad()
def test_prefill_asks_for_shared_keys_as_the_environment_says(monkeypatch, env, want):
    from deepinfer_model.paged import forward

    if env is None:
        monkeypatch.delenv("DEEPINFER_SPARSE_MLA_SHARED_KEYS", raising=False)
    else:
        monkeypatch.setenv("DEEPINFER_SPARSE_MLA_SHARED_KEYS", env)
    real = forward.sparse_mla_attention
    asked = []

    def attention(*args, shared_keys=False, **kw):
        asked.append(shared_keys)
        return real(*args, shared_keys=shared_keys, **kw)

    monkeypatch.setattr(forward, "sparse_mla_attention", attention)
    model = V41ForCausalLM(tiny(), dtype=torch.float32).init_random_weights(0).eval()
    seq = Seq(list(range(4, 44)), 40)
    drv = Driver(model, num_blocks=16, block_size=8)
    drv.prefill([seq], [40])
    assert asked and all(a == want for a in asked)
    seq.num_computed = 40
    seq.tokens.append(7)
    asked.clear()
    model.forward(drv.decode_meta([seq], [[]]), drv.cache)      # decode never asks
    assert asked and not any(asked)


def test_shared_keys_environment_value_is_checked(monkeypatch):
    from deepinfer_kernels.ops.sparse_mla import shared_keys_enabled

    monkeypatch.setenv("DEEPINFER_SPARSE_MLA_SHARED_KEYS", "2")
    with pytest.raises(ValueError, match="DEEPINFER_SPARSE_MLA_SHARED_KEYS"):
        shared_keys_enabled()


@pytest.mark.gpu
@pytest.mark.parametrize("group_rows", [4, 2])
@torch.no_grad()
def test_prefill_row_groups_share_keys_and_match_the_per_row_kernels(monkeypatch, group_rows):
    from deepinfer_kernels.platform import current_platform
    from deepinfer_kernels.tilelang import sparse_mla as sparse_mla_tl
    from deepinfer_model.paged import forward

    if not current_platform().is_sm90:
        pytest.skip("the TileLang kernels run on SM90")
    monkeypatch.setenv("DEEPINFER_SPARSE_MLA_SHARED_KEYS", "1")
    monkeypatch.setenv("DEEPINFER_SPARSE_MLA_GROUP_ROWS", str(group_rows))
    model = V41ForCausalLM(mini(), device=torch.device("cuda")).init_random_weights(0).eval()      # bf16
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 32000, (n,), generator=g).tolist() for n in (300, 257, 130)]   # 687 rows

    built = []
    real_lists = sparse_mla_tl.shared_key_lists_tilelang
    monkeypatch.setattr(sparse_mla_tl, "shared_key_lists_tilelang",
                        lambda idx, n=2: built.append((idx.shape, n)) or real_lists(idx, n))
    real = forward.sparse_mla_attention
    calls = []

    def attention(q, pool, indices, sm_scale, shared_keys=False):
        o, lse = real(q, pool, indices, sm_scale, shared_keys=shared_keys)
        per_row_o, per_row_lse = real(q, pool, indices, sm_scale)
        differ = torch.isfinite(lse) != torch.isfinite(per_row_lse)
        rows = differ.any(dim=1).nonzero().flatten()[:4].tolist()
        detail = [(r, int((indices[r] >= 0).sum()), bool(torch.isfinite(q[r].float()).all()), lse[r, :2].tolist(),
                   per_row_lse[r, :2].tolist()) for r in rows]   # (row, keys, q finite, lse, per-row lse)
        calls.append((shared_keys, indices.shape, (o.float() - per_row_o.float()).abs().max().item(),
                      per_row_o.float().abs().max().item(), detail))
        return o, lse

    monkeypatch.setattr(forward, "sparse_mla_attention", attention)
    seqs = [Seq(list(p), len(p)) for p in prompts]
    _, out = Driver(model, num_blocks=24, block_size=64, shuffle_seed=1).prefill(seqs, [len(p) for p in prompts])
    torch.cuda.synchronize()

    assert calls and all(shared for shared, *_ in calls), "the prefill forward asks for shared keys"
    assert len(built) == len(calls), "every sparse MLA call of the chunk took the shared-key kernel"
    assert all(n == group_rows for _, n in built), "quads at 16 heads when asked for, pairs otherwise"
    assert len({shape[1] for _, shape, *_ in calls}) >= 2, "window-only and window + far-entry layers"
    for _, shape, diff, scale, detail in calls:
        assert not detail, f"rows whose lse is finite in one kernel only (row, keys, q finite, lse, per-row lse): {detail}"
        assert diff <= 2e-2 * max(scale, 1.0), (shape, diff, scale)
    assert bool(torch.isfinite(out.logits.float()).all())
