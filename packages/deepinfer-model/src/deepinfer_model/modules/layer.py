"""One backbone layer: optional Engram, MLA attention sub-block, FFN (dense or MoE) sub-block.

```
x = x + Engram(x)              if layer in engram_layer_ids
x = x + Attn(RMSNorm(x))       (the attention sub-block is driven by the forward path)
x = x + FFN(RMSNorm(x))
```
"""

from __future__ import annotations

from torch import nn

from deepinfer_model.modules.engram import Engram
from deepinfer_model.modules.ffn import SwiGLU
from deepinfer_model.modules.mla import MLAAttention
from deepinfer_model.modules.moe import MoE
from deepinfer_model.modules.norm import RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        topo = cfg.topology
        self.layer_idx = layer_idx
        ratio = cfg.compress_ratios[layer_idx]
        self.ratio = ratio
        self.source = topo.layer_map[layer_idx] if ratio > 0 else layer_idx
        self.is_consumer = topo.is_consumer(layer_idx)
        self.engram = Engram(cfg) if layer_idx in cfg.engram_layer_ids else None
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg, ratio, has_compressor=topo.is_source(layer_idx),
                                      compressor_reads_input=not self.is_consumer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if layer_idx < cfg.first_k_dense_replace:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        else:
            self.mlp = MoE(cfg)
