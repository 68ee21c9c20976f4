"""Prompt logprobs: log p(prompt[t] | prompt[:t]) for t >= 1, plus the top-k alternatives.

The engine's own prefill cannot provide them: under YOCO the decoder (consumer) layers run only
over the last chunk's bounded-replay rows (docs/model.md), so earlier prompt positions never get
logits. A request with `prompt_logprobs` therefore gets one separate dense forward of its prompt,
`model.reference_forward(prompt, mode="exact", kv_quant=True)`: every layer over every position,
cached tensors round-tripped through their storage formats (FP8 latents, FP4 index keys) as the
paged path stores them. It is the full model's distribution over the prompt; it runs alone (batch
invariant by construction) and costs one forward of the prompt on the engine thread.
Values are clamped to -9999 (never -inf), like every logprob the engine reports.
"""

from __future__ import annotations

import torch

LOGPROB_FLOOR = -9999.0


@torch.no_grad()
def compute_prompt_logprobs(model, prompt_token_ids: list[int], num_top: int
                            ) -> tuple[list[float | None], list[dict[int, float] | None] | None]:
    """([None, lp_1, .., lp_{T-1}], top-k dicts per position (None first) or None when num_top == 0)."""
    ids = torch.tensor(prompt_token_ids, dtype=torch.long, device=model.device)
    t = ids.shape[0]
    if t < 2:
        return [None], ([None] if num_top else None)
    ref = model.reference_forward(ids, mode="exact", kv_quant=True)
    logits = ref.logits[: t - 1].float()                         # row r predicts token r + 1
    lp = torch.log_softmax(logits, dim=-1).clamp(min=LOGPROB_FLOOR)
    picked = lp.gather(1, ids[1:].unsqueeze(1)).squeeze(1).cpu().tolist()
    values: list[float | None] = [None] + [float(v) for v in picked]
    top: list[dict[int, float] | None] | None = None
    if num_top:
        v, i = torch.topk(lp, k=min(num_top, lp.shape[1]), dim=1)
        v, i = v.cpu().tolist(), i.cpu().tolist()
        top = [None] + [dict(zip(ii, vv)) for ii, vv in zip(i, v)]
    return values, top
