"""Training-side helpers: initialisation, optimizer groups, MoE bias balancing, greedy generation,
and the DSpark self-distillation targets."""

from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.nn.functional as F

from deepinfer_model.training import batched_draft, batched_forward

# output projections of residual branches: scaled down at init (GPT-2 style)
_RESIDUAL_OUT = ("o_proj.weight", "down_proj.weight", "experts.w2", "engram.proj.weight")


@torch.no_grad()
def init_for_training(model, seed: int, std: float = 0.02) -> None:
    """Deterministic init (CPU generator, then copied): N(0, std) matrices and embeddings, residual
    output projections std / sqrt(2 * layers), norms 1, biases / gates / confidence head 0."""
    g = torch.Generator().manual_seed(seed)
    n_layers = model.config.num_hidden_layers + model.config.nextn
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            v = torch.ones(p.shape)
        elif name.endswith(("pos_bias", "e_score_correction_bias", "confidence_head.weight",
                            "compressor.gate.weight")):
            v = torch.zeros(p.shape)
        elif name.endswith(_RESIDUAL_OUT):
            v = torch.randn(p.shape, generator=g) * std / math.sqrt(2 * n_layers)
        else:
            v = torch.randn(p.shape, generator=g) * std
        p.copy_(v.to(p.dtype))


def param_groups(params: dict[str, torch.nn.Parameter], weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (not on norms, biases, embeddings, Engram / Markov tables)."""
    decay, no_decay = [], []
    for name, p in params.items():
        if not p.requires_grad:
            continue
        table = "embed" in name or ".tables." in name
        (no_decay if p.dim() < 2 or table else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step: int, total: int, peak: float, warmup: int, final_frac: float) -> float:
    """Linear warm-up over `warmup` steps (independent of `total`), then cosine to final_frac * peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def update_router_bias(model, counts: dict[int, torch.Tensor], rate: float) -> torch.Tensor:
    """Auxiliary-loss-free balancing (DeepSeek-V3): bias_e += rate * sign(mean load - load_e).
    Returns the max/mean load ratio over the MoE layers (1.0 = balanced) as a device scalar."""
    worst = torch.ones((), device=model.device)
    for l, c in counts.items():
        c = c.float()
        bias = model.model.layers[l].mlp.gate.e_score_correction_bias
        bias.add_(rate * torch.sign(c.mean() - c).to(bias.dtype))
        worst = torch.maximum(worst, c.max() / c.mean().clamp_min(1))
    return worst


def uses_bf16(device: torch.device) -> bool:
    """bf16 autocast on CUDA; on the CPU only when DEEPINFER_TRAIN_AUTOCAST_CPU=1 (the smoke test
    uses it to run the CUDA dtype paths without a GPU)."""
    return device.type == "cuda" or os.environ.get("DEEPINFER_TRAIN_AUTOCAST_CPU") == "1"


def autocast(device: torch.device):
    if uses_bf16(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def greedy_generate(model, prompts: list[list[int]], max_new: int, device: torch.device,
                    batch: int = 256, pad_id: int = 0) -> list[list[int]]:
    """Greedy continuation of every prompt with the exact function (full recompute per token over a
    right-padded batch). -> the generated tokens per prompt (exactly max_new each)."""
    out: list[list[int]] = []
    for s in range(0, len(prompts), batch):
        group = prompts[s: s + batch]
        lens = torch.tensor([len(p) for p in group], device=device)
        width = int(lens.max()) + max_new
        toks = torch.full((len(group), width), pad_id, dtype=torch.long, device=device)
        for i, p in enumerate(group):
            toks[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        cur = lens.clone()
        rows = torch.arange(len(group), device=device)
        for _ in range(max_new):
            upto = int(cur.max())
            with autocast(device):
                res = batched_forward(model, toks[:, :upto], logits="positions", logit_positions=cur - 1)
            nxt = res.logits.argmax(-1)
            toks[rows, cur] = nxt
            cur = cur + 1
        for i, p in enumerate(group):
            out.append(toks[i, len(p): len(p) + max_new].tolist())
    return out


# ------------------------------------------------------------------------------ DSpark targets


def draft_targets(tokens: torch.Tensor, anchors: torch.Tensor, greedy: torch.Tensor | None, nextn: int,
                  require_greedy_main: bool = True):
    """Self-distillation targets for anchors [B, K] over tokens [B, L].

    greedy=None: `tokens` is the target's own greedy continuation at every anchor (generated data):
      label_j = tokens[p + 2 + j], prev_j = tokens[p + 1 + j].
    greedy [B, L] (argmax of the target's logits, greedy[t] predicts t + 1): real text; label_j =
      greedy[p + 1 + j], prev_j = tokens[p + 1 + j], and row j counts only while the real text follows
      the target's greedy path (tokens[p + 1 + i] == greedy[p + i] for i = 1..j; i = 0 too when
      require_greedy_main): the decode-time condition under which draft j is ever verified.
    -> labels [B, K, n], prev [B, K, n], valid bool [B, K, n]."""
    b, l_len = tokens.shape
    j = torch.arange(nextn, device=tokens.device)
    p = anchors.long().unsqueeze(-1)                                               # [B, K, 1]
    ctx = p + 1 + j                                                                # position of prev_j
    valid = ctx + 1 <= l_len - 1
    ctx_c = ctx.clamp(max=l_len - 1)
    flat = lambda t, idx: t.gather(1, idx.reshape(b, -1)).reshape(idx.shape)    # noqa: E731
    prev = flat(tokens, ctx_c)
    if greedy is None:
        labels = flat(tokens, (ctx + 1).clamp(max=l_len - 1))
    else:
        labels = flat(greedy, ctx_c)
        follows = prev == flat(greedy, (ctx - 1).clamp(min=0, max=l_len - 1))      # tokens[p+1+i] == greedy[p+i]
        if not require_greedy_main:
            follows[..., 0] = True
        valid = valid & (torch.cumprod(follows.long(), dim=-1) > 0)
    return labels, prev, valid


def draft_loss(model, features, tokens, anchors, labels, prev, valid):
    """Cross-entropy of the draft (Markov head on the teacher's previous tokens) + BCE of the
    confidence head on acceptance given every earlier draft accepted. -> (ce, bce, stats)."""
    db = batched_draft(model, features, tokens, anchors, prev)
    n_valid = valid.sum().clamp(min=1)
    ce = F.cross_entropy(db.logits[valid], labels[valid], reduction="sum") / n_valid
    with torch.no_grad():
        acc = (db.logits.argmax(-1) == labels) & valid
        before = torch.cumprod(torch.cat([torch.ones_like(acc[..., :1]), acc[..., :-1]], -1).long(), -1) > 0
        cond = valid & before
    bce = F.binary_cross_entropy_with_logits(db.conf_logits[cond], acc[cond].float(), reduction="sum") \
        / cond.sum().clamp(min=1)
    with torch.no_grad():
        per_pos = (acc.float().sum((0, 1)) / valid.float().sum((0, 1)).clamp(min=1)).tolist()
        accept_len = 1 + (torch.cumprod(acc.long(), -1).sum(-1)).float()
        full = valid.all(-1)
        stats = {"top1_by_pos": per_pos, "accept_len": float(accept_len[full].mean()) if bool(full.any()) else None,
                 "rows": int(valid.sum())}
    return ce, bce, stats


@torch.no_grad()
def teacher_forced_nll(model, windows, firsts, device, batch: int = 32) -> tuple[float, int]:
    """Sum of next-token NLL (nats) over the scored positions of token windows, and their count.

    windows: list of 1-D int arrays; firsts[i]: first position of window i whose token is scored
    (earlier ones are context shared with the previous window)."""
    nll, n = 0.0, 0
    for s in range(0, len(windows), batch):
        ws, fs = windows[s: s + batch], firsts[s: s + batch]
        width = max(len(w) for w in ws)
        toks = torch.zeros(len(ws), width, dtype=torch.long)
        scored = torch.zeros(len(ws), width, dtype=torch.bool)
        for i, (w, f) in enumerate(zip(ws, fs, strict=True)):
            toks[i, : len(w)] = torch.from_numpy(w)
            scored[i, f: len(w)] = True
        toks, scored = toks.to(device), scored.to(device)
        with autocast(device):
            logits = batched_forward(model, toks).logits
        lp = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), toks[:, 1:].reshape(-1),
                             reduction="none").reshape(len(ws), width - 1)
        m = scored[:, 1:]
        nll += float(lp[m].double().sum())
        n += int(m.sum())
    return nll, n
