"""Speculative verification over flat rows (SPEC §2, §4; docs/design.md "Two index languages").

``VERIFIED_END`` (-1) terminates each request's accepted-draft prefix in ``verified_token_ids``;
the C++ ledger reads it as ``deepinfer::kVerifiedEnd``.
"""

from deepinfer_kernels.ops.verification.accept import get_accept_result, get_accept_result_ref
from deepinfer_kernels.ops.verification.budget import (
    FRESH_SEQUENCE,
    clamp_verification_budget,
    compute_seqlens_q_by_confidence_rates,
    compute_seqlens_q_by_confidence_rates_ref,
)
from deepinfer_kernels.ops.verification.confidence_head import (
    confidence_head_fused,
    confidence_head_fused_ref,
)
from deepinfer_kernels.ops.verification.constants import VERIFIED_END
from deepinfer_kernels.ops.verification.finalize import (
    FinalizeResult,
    finalize_verification,
    finalize_verification_ref,
)
from deepinfer_kernels.ops.verification.metadata import (
    prepare_verification_metadata,
    prepare_verification_metadata_ref,
)
from deepinfer_kernels.ops.verification.mtp_info import (
    MTP_PADDING_ROW,
    MTP_PADDING_SLOT,
    MtpInfoPool,
    mtp_info_read_rows,
    read_mtp_info,
    store_mtp_info,
)
from deepinfer_kernels.ops.verification.verify_and_sample import (
    VerificationResult,
    verify_and_sample,
    verify_and_sample_ref,
)

__all__ = [
    "FRESH_SEQUENCE",
    "MTP_PADDING_ROW",
    "MTP_PADDING_SLOT",
    "VERIFIED_END",
    "FinalizeResult",
    "MtpInfoPool",
    "VerificationResult",
    "clamp_verification_budget",
    "compute_seqlens_q_by_confidence_rates",
    "compute_seqlens_q_by_confidence_rates_ref",
    "confidence_head_fused",
    "confidence_head_fused_ref",
    "finalize_verification",
    "finalize_verification_ref",
    "get_accept_result",
    "get_accept_result_ref",
    "mtp_info_read_rows",
    "prepare_verification_metadata",
    "prepare_verification_metadata_ref",
    "read_mtp_info",
    "store_mtp_info",
    "verify_and_sample",
    "verify_and_sample_ref",
]
