"""The seam between structured output and the model runner: who builds a step's grammar masks.

The runner holds one `MaskProvider` (`ModelRunner.set_mask_provider`; the engine passes its
`StructuredOutputManager` when the first grammar request arrives) and asks it, inside a step,
after the drafts are in the inputs and before sampling, for the masks of that step's logits rows.
Torch only: importing this module pulls in no grammar library.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from deepinfer_sched import SchedulerOutput


class VocabMasks(NamedTuple):
    """A step's grammar masks, in the layout `apply_vocab_mask_inplace` reads (a tuple: the
    sampler and the graphs unpack it as `(vocab_mask, row_mask_ids)`)."""

    vocab_mask: torch.Tensor     # [num_masks, ceil(vocab / 32)] int32 packed bitmask, one per constrained row
    row_mask_ids: torch.Tensor   # [num_logits_rows] int32 mask of each row, NO_VOCAB_MASK = unconstrained


class MaskProvider(Protocol):
    def step_masks(self, out: SchedulerOutput, input_ids: torch.Tensor,
                   device: torch.device | None = None) -> VocabMasks | None:
        """The masks of `out`'s logits rows, on `device` (default: input_ids' device), or None when
        no scheduled request is constrained. input_ids [total_q] int64: the step's input tokens
        with the drafts filled in (a host copy on the graphed path, so nothing syncs)."""
        ...
