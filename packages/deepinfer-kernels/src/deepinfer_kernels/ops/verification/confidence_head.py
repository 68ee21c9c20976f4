"""confidence_head_fused: the DSpark confidence head, P(draft accepted) per draft row.

``c = sigmoid(cat([hidden, markov_emb], -1) @ weight / temperature)`` in float32. Rows are
draft-block-major: row ``r = b * nextn + j`` is draft ``j`` of block ``b``, and a per-position
temperature ``[nextn]`` applies ``temperature[r % nextn]``. The reference splits the product as
``hidden @ weight[:H] + markov_emb @ weight[H:]`` (no concatenated copy).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, check_tensor, is_host
from deepinfer_kernels.platform import select_backend


def confidence_head_fused_ref(
    hidden: torch.Tensor,                # [n, H] float
    weight: torch.Tensor,                # [H + R] float
    temperature: float | torch.Tensor,   # scalar or [nextn] float
    markov_emb: torch.Tensor | None,     # [n, R] float or None
) -> torch.Tensor:                       # [n] float32
    h = hidden.shape[1]
    w = weight.to(torch.float32)
    z = hidden.to(torch.float32) @ w[:h]
    if markov_emb is not None:
        z = z + markov_emb.to(torch.float32) @ w[h:]
    if isinstance(temperature, torch.Tensor):
        nextn = temperature.shape[0]
        rows = torch.arange(hidden.shape[0], device=hidden.device) % nextn
        t = temperature.to(torch.float32)[rows]
    else:
        t = torch.tensor(float(temperature), dtype=torch.float32, device=hidden.device)
    return torch.sigmoid(z / t)


def confidence_head_fused(
    hidden: torch.Tensor,                      # [n, H] float, n = num_blocks * nextn (block-major)
    weight: torch.Tensor,                      # [H + R] float (R = 0 without a Markov head)
    temperature: float | torch.Tensor = 1.0,   # > 0: one value, or [nextn] float per draft position
    markov_emb: torch.Tensor | None = None,    # [n, R] float
) -> torch.Tensor:                             # [n] float32 in [0, 1]
    """``sigmoid(cat([hidden, markov_emb], -1) @ weight / temperature)``."""
    op = "confidence_head_fused"
    check_tensor(op, "hidden", hidden, [None, None], "[n, H]", FLOAT_DTYPES)
    (n, h), dev = hidden.shape, hidden.device
    r = 0
    if markov_emb is not None:
        check_tensor(op, "markov_emb", markov_emb, [n, None], "[n, R]", FLOAT_DTYPES, dev)
        r = markov_emb.shape[1]
    check_tensor(op, "weight", weight, [h + r], f"[H + R] = [{h + r}]", FLOAT_DTYPES, dev)
    if isinstance(temperature, torch.Tensor):
        check_tensor(op, "temperature", temperature, [None], "[nextn]", FLOAT_DTYPES, dev)
        nextn = temperature.shape[0]
        if nextn == 0 or n % nextn:
            raise ValueError(f"{op}: hidden rows ({n}) must be a multiple of nextn = temperature.shape[0] ({nextn})")
        if is_host(temperature) and bool((~(temperature > 0)).any()):
            raise ValueError(f"{op}: temperature must be > 0")
    elif not float(temperature) > 0:
        raise ValueError(f"{op}: temperature must be > 0, got {temperature}")
    select_backend(op, dev, has_kernel=False)
    return confidence_head_fused_ref(hidden, weight, temperature, markov_emb)
