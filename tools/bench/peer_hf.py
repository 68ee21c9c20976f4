"""The peer: HF transformers' DeepseekV3ForCausalLM with the `mini` dims, random bf16 weights, sdpa.

What a user would otherwise run for an MLA + MoE model of this size. Same GPU, same process, same
methodology as tools/benchmark.py: greedy decode with a KV cache after a --prompt-len prefill
(skip warm-up steps, time the rest), and one batched prefill forward of --prefill-batch prompts.

Dims: hidden 1024, 16 layers, 16 heads, 64 routed experts top-6 + 1 shared (width 512), vocab
32000, kv_lora_rank 448, qk_rope_head_dim 64, q_lora_rank 384; DeepSeek-V3's per-head
qk_nope/v head dims of 128 (HF's MLA up-projects the latent per head, which our single shared KV
head does not), every layer MoE (first_k_dense_replace 0), one routing group.
"""

from __future__ import annotations

import time

import torch


def build_peer(device: str = "cuda"):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512,
        num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=1,
        n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=0, n_group=1, topk_group=1,
        q_lora_rank=384, kv_lora_rank=448, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        max_position_embeddings=4096, attn_implementation="sdpa", torch_dtype=torch.bfloat16,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    return model.eval()


@torch.no_grad()
def peer_decode(model, batch: int, prompt_len: int, warmup: int, steps: int) -> dict:
    ids = torch.randint(10, 32000, (batch, prompt_len), device="cuda")
    out = model(input_ids=ids, use_cache=True)
    pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=pkv, use_cache=True)
        pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    sps = steps / (time.perf_counter() - start)
    return dict(kind="decode", engine="hf-transformers", batch=batch, prompt_len=prompt_len, avg_sps=sps,
                tokens_per_s_real=sps * batch, step_ms=1e3 / sps)


@torch.no_grad()
def peer_prefill(model, batch: int, prompt_len: int, runs: int = 5) -> dict:
    ids = torch.randint(10, 32000, (batch, prompt_len), device="cuda")
    model(input_ids=ids, use_cache=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(runs):
        model(input_ids=ids, use_cache=False)
    torch.cuda.synchronize()
    return dict(kind="prefill", engine="hf-transformers", batch=batch, prompt_len=prompt_len,
                tokens_per_s=runs * batch * prompt_len / (time.perf_counter() - start))


def bench_peer(args) -> list[dict]:
    model = build_peer()
    rows = []
    for b in (int(x) for x in args.decode_batch_sizes.split(",") if x):   # "" = prefill only
        rows.append(peer_decode(model, b, args.prompt_len, warmup=5, steps=20))
    if not args.no_prefill:
        rows.append(peer_prefill(model, args.prefill_batch, args.prompt_len))
    del model
    torch.cuda.empty_cache()
    return rows
