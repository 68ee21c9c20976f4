"""verify_and_sample: one decode step's sampler over flat rows, from target probabilities to ledger.

Pipeline (all requests at once, no per-request loop)::

    1. prepare_verification_metadata(ftp, seqlens_q)   -> row_to_req, local_step, is_verify
    2. speculative_accept_ref per row                   -> raw_accept   (greedy: x == argmax p;
                                                                          sampling: U_ACCEPT * q(x) < p(x))
    3. get_accept_result                                -> effective_accept, is_final
    4. finalize_verification                            -> final_row, counts, verified_token_ids
    5. sample_main_token_ref at each final row          -> token_ids [req_cnt]

Which distribution every emitted token comes from (request ``i``, rows ``ftp[i]..``, row ``r``
predicting position ``positions[r] + 1``):

- accepted draft ``k`` (``verified_token_ids[ftp[i] + k]``): the token of row ``ftp[i] + k + 1``,
  accepted by ``target_probs[ftp[i] + k]``; its logprob is ``log target_probs[ftp[i] + k, x]``.
- main token: drawn at the final row ``f = ftp[i] + num_accepted[i]`` from ``target_probs[f]``
  (greedy: its argmax; all drafts accepted or none: fresh sample, stream SAMPLE; else the
  residual ``norm(max(0, p_f - q_f))`` of the rejected draft, stream RESIDUAL); its logprob is
  ``log target_probs[f, main]`` (the target's, not the residual's).

Every uniform is keyed by ``(seeds[i], position of the token decided)``, so seeded results do not
depend on the batch. ``target_probs`` are the sampling distributions (``probs_from_logits``:
greedy rows one-hot); ``draft_probs`` the distributions the drafts were sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, is_host
from deepinfer_kernels.ops.verification.accept import get_accept_result_ref
from deepinfer_kernels.ops.verification.finalize import finalize_verification_ref
from deepinfer_kernels.ops.verification.metadata import check_layout_args, prepare_verification_metadata_ref
from deepinfer_kernels.ops.verification.speculative import sample_main_token_ref, speculative_accept_ref
from deepinfer_kernels.platform import select_backend


@dataclass(frozen=True)
class VerificationResult:
    token_ids: torch.Tensor           # [req_cnt] int32 main token of each request
    token_logprobs: torch.Tensor      # [req_cnt] float32 log target_probs[final_row, main token]
    verified_token_ids: torch.Tensor  # [total_q] int32 accepted drafts, then VERIFIED_END
    verified_logprobs: torch.Tensor   # [total_q] float32 log p of each accepted draft at its row; 0 elsewhere
    num_accepted: torch.Tensor        # [req_cnt] int32
    num_verified: torch.Tensor        # [req_cnt] int32 drafts checked (seqlens_q - 1)
    last_valid_offset: torch.Tensor   # [req_cnt] int32 final row - ftp (== num_accepted)
    final_row: torch.Tensor           # [req_cnt] int32 flat row the main token was drawn at


def verify_and_sample_ref(
    target_probs: torch.Tensor,        # [total_q, vocab] float
    draft_token_ids: torch.Tensor,     # [total_q] int
    draft_probs: torch.Tensor | None,  # [total_q, vocab] float or None
    seeds: torch.Tensor,               # [req_cnt] int64
    positions: torch.Tensor,           # [total_q] int
    ftp: torch.Tensor,                 # [req_cnt] int32
    seqlens_q: torch.Tensor,           # [req_cnt] int32
    is_greedy: torch.Tensor,           # [req_cnt] bool
    all_greedy: bool = False,          # host fact: every request greedy (skips the sampling paths)
) -> VerificationResult:
    total_q = target_probs.shape[0]
    row_to_req, _, is_verify = prepare_verification_metadata_ref(ftp, seqlens_q, total_q)
    req = row_to_req.to(torch.int64)
    token_pos = positions.to(torch.int64) + 1
    # Final rows carry no draft to check; clamp their id so the gathers stay in range.
    vocab = target_probs.shape[1]
    draft_ids = torch.where(is_verify, draft_token_ids.to(torch.int64), 0).clamp(0, vocab - 1)

    raw_accept = speculative_accept_ref(target_probs, draft_ids, draft_probs, seeds[req], token_pos, is_greedy[req],
                                        all_greedy)
    effective_accept, is_final = get_accept_result_ref(raw_accept, is_verify, ftp, row_to_req)
    fin = finalize_verification_ref(effective_accept, is_final, is_verify, draft_token_ids, ftp, row_to_req)

    f = fin.final_row.to(torch.int64)
    p_final = target_probs[f]
    main = sample_main_token_ref(
        p_final,
        draft_ids[f],
        None if draft_probs is None else draft_probs[f],
        is_verify[f],
        seeds,
        token_pos[f],
        is_greedy,
        all_greedy,
    )
    token_logprobs = torch.log(p_final.gather(1, main.unsqueeze(1)).squeeze(1).to(torch.float32))
    p_draft = target_probs.gather(1, draft_ids.unsqueeze(1)).squeeze(1).to(torch.float32)
    verified_logprobs = torch.where(effective_accept, torch.log(p_draft), 0.0)
    return VerificationResult(
        token_ids=main.to(torch.int32),
        token_logprobs=token_logprobs,
        verified_token_ids=fin.verified_token_ids,
        verified_logprobs=verified_logprobs,
        num_accepted=fin.num_accepted,
        num_verified=fin.num_verified,
        last_valid_offset=fin.last_valid_offset,
        final_row=fin.final_row,
    )


def verify_and_sample(
    target_probs: torch.Tensor,        # [total_q, vocab] float: target sampling distribution of each row
    draft_token_ids: torch.Tensor,     # [total_q] int32/int64: draft checked at each row (= token of
                                       #   the next row); values on final rows are ignored
    draft_probs: torch.Tensor | None,  # [total_q, vocab] float: q the row's draft was drawn from;
                                       #   None = drafts were proposed deterministically (one-hot q)
    seeds: torch.Tensor,               # [req_cnt] int64 per-request seed (uint64 bits)
    positions: torch.Tensor,           # [total_q] int32/int64 position of each row's input token
    ftp: torch.Tensor,                 # [req_cnt] int32 first row of each request
    seqlens_q: torch.Tensor,           # [req_cnt] int32 rows per request (1 + drafts)
    is_greedy: torch.Tensor | None = None,  # [req_cnt] bool; None = no greedy request
    all_greedy: bool = False,          # host fact: every request greedy (must agree with is_greedy)
) -> VerificationResult:
    """Greedy verification and exact speculative sampling for one step (module docstring)."""
    op = "verify_and_sample"
    check_tensor(op, "target_probs", target_probs, [None, None], "[total_q, vocab]", FLOAT_DTYPES)
    (total_q, vocab), dev = target_probs.shape, target_probs.device
    if vocab == 0:
        raise ValueError(f"{op}: target_probs must have vocab >= 1 columns")
    check_layout_args(op, ftp, seqlens_q, total_q)
    req_cnt = ftp.shape[0]
    if ftp.device != dev:
        raise ValueError(f"{op}: ftp must be on {dev} like target_probs, got {ftp.device}")
    check_tensor(op, "draft_token_ids", draft_token_ids, [total_q], "[total_q]", INDEX_DTYPES, dev)
    if draft_probs is not None:
        check_tensor(op, "draft_probs", draft_probs, [total_q, vocab], "[total_q, vocab]", FLOAT_DTYPES, dev)
    check_tensor(op, "seeds", seeds, [req_cnt], "[req_cnt]", [torch.int64], dev)
    check_tensor(op, "positions", positions, [total_q], "[total_q]", INDEX_DTYPES, dev)
    if is_greedy is None:
        is_greedy = torch.zeros(req_cnt, dtype=torch.bool, device=dev)
    check_tensor(op, "is_greedy", is_greedy, [req_cnt], "[req_cnt]", [torch.bool], dev)
    if is_host(draft_token_ids) and total_q:
        _, _, is_verify = prepare_verification_metadata_ref(ftp, seqlens_q, total_q)
        bad = is_verify & ((draft_token_ids < 0) | (draft_token_ids >= vocab))
        if bool(bad.any()):
            r = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"{op}: draft_token_ids[{r}] = {int(draft_token_ids[r])} on a verify row is "
                             f"outside [0, vocab={vocab})")
    if all_greedy and is_host(is_greedy) and not bool(is_greedy.all()):
        raise ValueError(f"{op}: all_greedy=True but is_greedy has non-greedy requests")
    select_backend(op, dev, has_kernel=False)
    return verify_and_sample_ref(target_probs, draft_token_ids, draft_probs, seeds, positions, ftp, seqlens_q,
                                 is_greedy, all_greedy)
