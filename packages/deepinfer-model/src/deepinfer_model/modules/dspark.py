"""DSpark draft block (DFlash): target-feature projection, `nextn` DFlash layers, Markov and
confidence heads.

```
f_t        = RMSNorm(W_proj · concat(x^(l)_t for l in dspark_target_layer_ids))   target features
main key   = DFlash layer k's latent of RMSNorm_attn_k(f_t) at position t             (every k)
block      = positions p+1 .. p+nextn, inputs embed(m), embed(noise) ...            (m = main token)
h          = DFlash layers over the block (window attention: main keys <= p + the block, causal)
base_j     = lm_head(RMSNorm(h_j))                      predicts the token at p + 2 + j
e_j        = E_markov[prev_j]  (prev_0 = m, prev_j = draft_{j-1});  logits_j = base_j + W_markov e_j (fp32)
conf_j     = sigmoid(w_conf · cat(RMSNorm(h_j), e_j) / T)
```
`heads` is shared by the engine path and the reference (it has no cache).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_model.metadata import DraftOutput
from deepinfer_model.modules.ffn import SwiGLU
from deepinfer_model.modules.linear import Linear
from deepinfer_model.modules.mla import MLAAttention
from deepinfer_model.modules.norm import RMSNorm, rms_norm
from deepinfer_model.modules.rope import apply_rope


class DFlashLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg, ratio=0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.dspark_intermediate_size)

    def main_keys(self, f: torch.Tensor, positions) -> torch.Tensor:
        """f [N, H] target features, positions [N] (or their RopeTable) -> this layer's main-token latents [N, D]."""
        return self.self_attn.latent(self.input_layernorm(f), positions)


class DSparkDraft(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg.hidden_size
        self.nextn = cfg.nextn
        self.noise_token_id = cfg.dspark_noise_token_id
        self.target_layer_ids = tuple(cfg.dspark_target_layer_ids)
        self.temperature = cfg.dspark_confidence_temperature
        self.markov_rank = cfg.dspark_markov_rank
        self.projection = Linear(h * len(self.target_layer_ids), h, bias=False)
        self.projection_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.nextn))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        if self.markov_rank > 0:
            self.markov_embed = nn.Embedding(cfg.vocab_size, self.markov_rank)
            self.markov_proj = Linear(self.markov_rank, cfg.vocab_size, bias=False)
        self.confidence_head = Linear(h + self.markov_rank, 1, bias=False)

    def main_keys_all(self, f: torch.Tensor, positions) -> torch.Tensor:
        """f [N, H] target features, positions [N] (or their RopeTable) -> every DFlash layer's
        main-token latent [nextn, N, D]: `DFlashLayer.main_keys` of each layer, bit for bit, with the
        norms and the RoPE of all layers done together (a few kernels instead of ~30 per layer)."""
        attns = [layer.self_attn for layer in self.layers]
        norms = [layer.input_layernorm for layer in self.layers]
        eps = norms[0].eps
        if any(n.eps != eps or a.kv_a_layernorm.eps != eps for n, a in zip(norms, attns, strict=True)):
            raise ValueError("main_keys_all: the DFlash layers' norms must share one eps")
        k, dc, theta = len(attns), attns[0].dc, attns[0].theta
        u = rms_norm(f.unsqueeze(0).expand(k, -1, -1), torch.stack([n.weight for n in norms]).unsqueeze(1), eps)
        kv = torch.stack([a.kv_a_proj_with_mqa(u[i]) for i, a in enumerate(attns)], dim=1)   # [N, K, dc + r]
        lat = rms_norm(kv[..., :dc], torch.stack([a.kv_a_layernorm.weight for a in attns]), eps)
        return torch.cat([lat, apply_rope(kv[..., dc:], positions, theta)], dim=-1).transpose(0, 1)

    def features(self, hiddens: list[torch.Tensor]) -> torch.Tensor:
        """residual streams after the target layers, each [N, H] -> f [N, H]."""
        return self.projection_norm(self.projection(torch.cat(hiddens, dim=-1)))

    def block_inputs(self, main_tokens: torch.Tensor, embed: nn.Embedding) -> torch.Tensor:
        """main_tokens [R] -> block input hidden [R, nextn, H]: embed(m), then embed(noise)."""
        toks = torch.full((main_tokens.shape[0], self.nextn), self.noise_token_id,
                          dtype=torch.long, device=main_tokens.device)
        toks[:, 0] = main_tokens.long()
        return embed(toks)

    def heads(self, h: torch.Tensor, lm_head_weight: torch.Tensor, main_tokens: torch.Tensor,
              uniforms: torch.Tensor | None = None, greedy: torch.Tensor | None = None) -> DraftOutput:
        """h [R, nextn, H] (DFlash output, before the final norm), main_tokens [R],
        uniforms [R, nextn] in [0, 1) or None (all greedy), greedy [R] bool: rows that take the
        argmax even when uniforms are given -> DraftOutput."""
        hn = self.norm(h)
        base = F.linear(hn, lm_head_weight).float()                                # [R, n, V]
        hnf = hn.float()
        prev = main_tokens.long()
        tokens, logits_all, conf = [], [], []
        for j in range(self.nextn):
            if self.markov_rank > 0:
                e = self.markov_embed(prev).float()                                 # [R, rank]
                logits = base[:, j] + F.linear(e, self.markov_proj.weight.float())
                cat = torch.cat([hnf[:, j], e], dim=-1)
            else:
                logits = base[:, j]
                cat = hnf[:, j]
            probs = torch.softmax(logits, dim=-1)
            tok = logits.argmax(-1)
            if uniforms is not None:
                cdf = probs.cumsum(-1)
                target = (uniforms[:, j].float() * cdf[:, -1]).unsqueeze(1)
                sampled = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)
                tok = sampled if greedy is None else torch.where(greedy, tok, sampled)
            c = torch.sigmoid(F.linear(cat, self.confidence_head.weight.float()).squeeze(-1) / self.temperature)
            tokens.append(tok)
            logits_all.append(logits)
            conf.append(c)
            prev = tok
        logits_t = torch.stack(logits_all, 1)
        return DraftOutput(token_ids=torch.stack(tokens, 1), logits=logits_t,
                           probs=torch.softmax(logits_t, -1), confidence=torch.stack(conf, 1))
