"""Name mapping between HF checkpoint tensors and the module's parameters.

Every parameter keeps its HF name (`model.layers.{l}.self_attn.q_a_proj.weight`, ...) except the
routed experts, which the module stacks for the grouped GEMM:

| HF tensor (per expert e, shape)                              | module parameter (slice)                  |
| ------------------------------------------------------------ | ----------------------------------------- |
| `model.layers.{l}.mlp.experts.{e}.gate_proj.weight` [I, H]   | `model.layers.{l}.mlp.experts.w13[e, :I]` |
| `model.layers.{l}.mlp.experts.{e}.up_proj.weight`   [I, H]   | `model.layers.{l}.mlp.experts.w13[e, I:]` |
| `model.layers.{l}.mlp.experts.{e}.down_proj.weight` [H, I]   | `model.layers.{l}.mlp.experts.w2[e]`      |

With `tie_word_embeddings`, `lm_head.weight` is not stored. Tensor inventory per layer kind:
docs/model.md ("Checkpoint layout").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

_W13, _W2 = ".mlp.experts.w13", ".mlp.experts.w2"


@dataclass(frozen=True)
class HFTensor:
    hf_name: str
    param: str                    # module parameter name
    index: tuple | None = None    # slice of the parameter (None = whole)
    shape: tuple[int, ...] = ()


def hf_tensors(model) -> Iterator[HFTensor]:
    """Every tensor the checkpoint of `model` holds, with where it lives in the module."""
    tied = model.config.tie_word_embeddings
    for name, p in model.named_parameters():
        if name.endswith(_W13):
            prefix = name[: -len(".w13")]
            inter = p.shape[1] // 2
            for e in range(p.shape[0]):
                yield HFTensor(f"{prefix}.{e}.gate_proj.weight", name, (e, slice(0, inter)), (inter, p.shape[2]))
                yield HFTensor(f"{prefix}.{e}.up_proj.weight", name, (e, slice(inter, 2 * inter)),
                               (inter, p.shape[2]))
        elif name.endswith(_W2):
            prefix = name[: -len(".w2")]
            for e in range(p.shape[0]):
                yield HFTensor(f"{prefix}.{e}.down_proj.weight", name, (e,), tuple(p.shape[1:]))
        elif name == "lm_head.weight" and tied:
            continue
        else:
            yield HFTensor(name, name, None, tuple(p.shape))


def read_param(params: dict[str, torch.Tensor], t: HFTensor) -> torch.Tensor:
    p = params[t.param]
    return p if t.index is None else p[t.index]
