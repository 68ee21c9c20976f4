"""Sampling ops: counter-based RNG, batch-invariant sampling, sampling parameters, logprobs, masks."""

from deepinfer_kernels.ops.sampling.logprobs import compute_logprobs, gather_token_logprobs, top_logprobs
from deepinfer_kernels.ops.sampling.random_sampling import (
    EMPTY_ROW_SAMPLE,
    random_sampling,
    random_sampling_ref,
    sample_from_uniform_ref,
)
from deepinfer_kernels.ops.sampling.rng import RngStream, counter_uniform, counter_uniform_ref
from deepinfer_kernels.ops.sampling.sampling_params import (
    GREEDY_TEMPERATURE,
    TOP_K_OFF,
    TOP_P_OFF,
    apply_sampling_params,
    apply_sampling_params_ref,
    probs_from_logits,
)
from deepinfer_kernels.ops.sampling.sum_smaller import get_sum_smaller_probs, get_sum_smaller_probs_ref
from deepinfer_kernels.ops.sampling.vocab_mask import (
    NO_VOCAB_MASK,
    apply_vocab_mask_by_step_inplace,
    apply_vocab_mask_inplace,
    unpack_vocab_mask,
)

__all__ = [
    "EMPTY_ROW_SAMPLE",
    "GREEDY_TEMPERATURE",
    "NO_VOCAB_MASK",
    "TOP_K_OFF",
    "TOP_P_OFF",
    "RngStream",
    "apply_sampling_params",
    "apply_sampling_params_ref",
    "apply_vocab_mask_by_step_inplace",
    "apply_vocab_mask_inplace",
    "compute_logprobs",
    "counter_uniform",
    "counter_uniform_ref",
    "gather_token_logprobs",
    "get_sum_smaller_probs",
    "get_sum_smaller_probs_ref",
    "probs_from_logits",
    "random_sampling",
    "random_sampling_ref",
    "sample_from_uniform_ref",
    "top_logprobs",
    "unpack_vocab_mask",
]
