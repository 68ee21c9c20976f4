"""`V41ForCausalLM`: the module tree (HF names) and the entry points of both forward paths.

```python
model = V41ForCausalLM(cfg)                       # float32 on the CPU, bf16 on CUDA by default
model.init_random_weights(seed)                   # bf16-representable random weights
cache = model.allocate_kv_cache(num_blocks, block_size, device)
out = model.forward(meta, cache)                  # engine path -> ForwardOutput
model.dspark_write_main_keys(meta, out, cache)    # DFlash main-token keys of the processed rows
draft = model.dspark_draft(draft_meta, cache)     # -> DraftOutput (nextn tokens, probs, confidence)
ref = model.reference_forward(token_ids, mode="bounded_replay", prompt_len=P, kv_quant=True)
```
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from deepinfer_model.config import V41Config
from deepinfer_model.metadata import DraftMetadata, DraftOutput, ForwardMetadata, ForwardOutput
from deepinfer_model.modules.dspark import DSparkDraft
from deepinfer_model.modules.fused_projection import refresh_fused_projections
from deepinfer_model.modules.layer import DecoderLayer
from deepinfer_model.modules.linear import Linear
from deepinfer_model.modules.norm import RMSNorm
from deepinfer_model.paged_cache import CacheLayout, PagedKVCache, WindowRing, allocate_kv_cache


def default_dtype(device: torch.device) -> torch.dtype:
    """Compute dtype: float32 on the CPU (weights hold bf16 values), bf16 on CUDA."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@contextlib.contextmanager
def _built_on(device: torch.device, dtype: torch.dtype):
    """Parameters created inside are allocated on `device` in `dtype` (off the CPU only): a
    full-width model (`flash-slice`, 91 GB in bf16) is never materialized on the host in float32.
    The constructors' own values (zeros, ones, kaiming) are overwritten by every loader."""
    if device.type == "cpu":
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


class V41Model(nn.Module):
    def __init__(self, cfg: V41Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, l) for l in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.dspark = DSparkDraft(cfg) if cfg.nextn > 0 else None


class V41ForCausalLM(nn.Module):
    def __init__(self, cfg: V41Config, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        device = torch.device(device or "cpu")
        self.config = cfg
        with _built_on(device, dtype or default_dtype(device)):
            self.model = V41Model(cfg)
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.to(device=device, dtype=dtype or default_dtype(device))
        refresh_fused_projections(self)   # the conversion gave the fused members fresh storage
        # token id -> compressed (Engram) id; identity until a tokenizer provides the classes.
        self.register_buffer("engram_vocab_map", torch.arange(cfg.vocab_size, dtype=torch.int32, device=device),
                             persistent=False)
        # decode steps on CUDA launch their independent chains on side streams (engine/streams.py);
        # the engine sets it from EngineConfig.decode_streams / DEEPINFER_DECODE_STREAMS
        self.decode_streams = False

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    # ------------------------------------------------------------------ weights
    INIT_CHUNK_BYTES = 4 << 30   # larger stacked weights are drawn one slice at a time (other values then)

    @torch.no_grad()
    def init_random_weights(self, seed: int = 0, std: float = 0.02, on_device: bool = False) -> V41ForCausalLM:
        """Deterministic random weights (rounded to bf16): norms ~1, linear weights N(0, 1/fan_in),
        embeddings and Engram tables N(0, 1), small biases. Generated on the CPU (the same values on
        every machine) unless `on_device` (fast for large presets; values depend on the device)."""
        gen_device = self.device if on_device else torch.device("cpu")
        g = torch.Generator(device=gen_device).manual_seed(seed)

        def randn(shape: torch.Size) -> torch.Tensor:
            return torch.randn(shape, generator=g, device=gen_device)

        def linear(shape: torch.Size) -> torch.Tensor:   # [..., out, in]: unit-variance outputs
            return randn(shape) * shape[-1] ** -0.5

        for name, p in self.named_parameters():
            if p.numel() * 4 > self.INIT_CHUNK_BYTES and p.dim() >= 3:   # stacked experts of a full-width model
                for i in range(p.shape[0]):                                 # float32 temporaries one expert at a time
                    p[i].copy_(linear(p.shape[1:]).to(torch.bfloat16).to(p.dtype))
                continue
            if name.endswith("norm.weight") or "layernorm" in name:
                v = 1.0 + 0.1 * randn(p.shape)
            elif name.endswith("pos_bias"):
                v = 0.5 * randn(p.shape)
            elif name.endswith("e_score_correction_bias"):
                v = 0.01 * randn(p.shape)
            elif name.endswith("engram.gate.weight") or name.endswith("compressor.gate.weight"):
                v = 0.2 * randn(p.shape)
            elif p.dim() == 1:
                v = std * randn(p.shape)
            elif "embed" in name or ".tables." in name:
                v = randn(p.shape)
            else:  # linear / stacked expert weights
                v = linear(p.shape)
            p.copy_(v.to(torch.bfloat16).to(p.dtype))
        return self

    # Parameters every forward reads as float32 (`.float()`): norm weights, the routing and
    # compression biases, the DSpark heads' small weights. Kept in float32 they cost no conversion
    # kernel per use (~50 per decode step of the default model, ~90 with DSpark); values unchanged.
    FLOAT32_PARAM_SUFFIXES = ("pos_bias", "e_score_correction_bias", "markov_embed.weight", "markov_proj.weight",
                              "confidence_head.weight")

    @torch.no_grad()
    def keep_float32_params(self) -> V41ForCausalLM:
        """Store the parameters that are only ever read as float32 in float32 (inference; bit-identical results)."""
        for module_name, module in self.named_modules():
            for name, param in module.named_parameters(recurse=False):
                full = f"{module_name}.{name}" if module_name else name
                if isinstance(module, RMSNorm) or full.endswith(self.FLOAT32_PARAM_SUFFIXES):
                    param.data = param.data.float()
        return self

    def set_engram_vocab_map(self, vocab_map: list[int] | torch.Tensor) -> None:
        m = torch.as_tensor(vocab_map, dtype=torch.int32, device=self.device)
        if m.shape != (self.config.vocab_size,):
            raise ValueError(f"engram vocab map: shape {tuple(m.shape)}, expected ({self.config.vocab_size},)")
        self.engram_vocab_map = m

    # ------------------------------------------------------------------ caches
    def cache_layout(self, ring: WindowRing | None = None) -> CacheLayout:
        return CacheLayout.from_config(self.config, ring)

    @property
    def stage_dtype(self) -> torch.dtype:
        """dtype of the compressor stage planes (float32 models keep float32, others their dtype)."""
        return torch.float32 if self.dtype == torch.float32 else self.dtype

    def kv_cache_bytes_per_block(self, block_size: int, ring: WindowRing | None = None) -> int:
        """Bytes one block of `block_size` tokens takes over all paged caches (pool sizing); with
        `ring` the window planes and stages are per-sequence rings (`kv_cache_fixed_bytes`)."""
        return self.cache_layout(ring).bytes_per_block(block_size, self.stage_dtype)

    def kv_cache_fixed_bytes(self, ring: WindowRing | None) -> int:
        """Bytes of the caches independent of the block count: the rings and their scratch."""
        return self.cache_layout(ring).fixed_bytes(self.stage_dtype)

    def allocate_kv_cache(self, num_blocks: int, block_size: int, device: torch.device | str | None = None,
                          ring: WindowRing | None = None) -> PagedKVCache:
        """`ring`: window planes and compressor stages as per-request rings (paged/ring.py)."""
        return allocate_kv_cache(self.config, num_blocks, block_size, device or self.device,
                                 stage_dtype=self.stage_dtype, ring=ring)

    # ------------------------------------------------------------------ forward paths
    @torch.no_grad()
    def forward(self, meta: ForwardMetadata, cache: PagedKVCache) -> ForwardOutput:
        """Engine path over the paged caches (see paged/forward.py)."""
        from deepinfer_model.paged.forward import paged_forward
        return paged_forward(self, meta, cache)

    @torch.no_grad()
    def dspark_write_main_keys(self, meta: ForwardMetadata, out: ForwardOutput, cache: PagedKVCache) -> None:
        """Write every DFlash layer's main-token keys from `out.dspark_features` at the slots of
        `out.full_rows` (all processed rows, written optimistically)."""
        from deepinfer_model.paged.dspark import write_main_keys
        write_main_keys(self, meta, out, cache)

    @torch.no_grad()
    def dspark_draft(self, meta: DraftMetadata, cache: PagedKVCache, uniforms: torch.Tensor | None = None,
                     greedy: torch.Tensor | None = None) -> DraftOutput:
        """`nextn` draft tokens per request: greedy, or inverse-CDF with uniforms [req, nextn]
        except for the rows `greedy` [req] marks."""
        from deepinfer_model.paged.dspark import draft_forward
        return draft_forward(self, meta, cache, uniforms, greedy)

    def reference_forward(self, token_ids: torch.Tensor, mode: str = "exact", prompt_len: int | None = None,
                          kv_quant: bool = False, return_dspark_features: bool = False,
                          enable_grad: bool = False):
        """Dense, unpaged oracle for one sequence (see reference.py) -> ReferenceOutput."""
        from deepinfer_model.reference import reference_forward
        return reference_forward(self, token_ids, mode=mode, prompt_len=prompt_len, kv_quant=kv_quant,
                                 return_dspark_features=return_dspark_features, enable_grad=enable_grad)

    def reference_draft(self, token_ids: torch.Tensor, main_token: int, prompt_len: int | None = None,
                        kv_quant: bool = False, uniforms: torch.Tensor | None = None) -> DraftOutput:
        """Dense draft for one sequence whose last token is at position p = len(token_ids) - 1."""
        from deepinfer_model.reference import reference_draft
        return reference_draft(self, token_ids, main_token, prompt_len=prompt_len, kv_quant=kv_quant,
                               uniforms=uniforms)
