"""StructuredOutputManager: compile tickets, per-request matchers, and each step's vocab masks.

Engine side (between steps): `submit` at add_request, `poll` each step (compiled requests enter
the scheduler, failed ones finish with an error), `commit` the emitted tokens in
`OutputProcessor.consume`.

Runner side (inside a step, before sampling): the manager is the runner's `MaskProvider`
(mask_provider.py): `step_masks(out, input_ids)` returns `VocabMasks(vocab_mask [num_masks, W]
int32, row_mask_ids [rows] int32)` on input_ids' device for `apply_vocab_mask_inplace`, or None
when no scheduled request has a grammar. Graphed grammar steps
pass input_ids already copied to the host (model_runner's split step), so nothing syncs here. In a decode step
request i owns rows ftp[i] .. ftp[i] + seqlen_q[i] - 1; its drafts are the input tokens of rows
1.. (on the device, filled from the MTP pool): the one host sync of the mask path copies those
draft tokens of grammar requests to the host (a [num_grammar_draft_rows] int64 gather).
"""

from __future__ import annotations

import collections
import time

import numpy as np
import torch

from deepinfer_engine.host_copy import to_device
from deepinfer_engine.structured_output.compiler import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_TIMEOUT_S,
    CompileTicket,
    GrammarCompileError,
    GrammarCompilerService,
)
from deepinfer_engine.structured_output.mask_provider import MaskProvider, VocabMasks
from deepinfer_engine.structured_output.matcher import RequestGrammar, fill_rows_batch
from deepinfer_engine.structured_output.spec import StructuredOutput
from deepinfer_engine.structured_output.unique_keys import KeyGuard, KeyGuardTokens
from deepinfer_engine.structured_output.xgrammar_compat import import_xgrammar
from deepinfer_kernels.ops.sampling import NO_VOCAB_MASK
from deepinfer_sched import StepKind


def mask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class StructuredOutputManager(MaskProvider):
    def __init__(self, token_bytes: list[bytes], vocab_size: int, eos_token_ids: list[int], nextn: int, *,
                 compile_timeout_s: float = DEFAULT_TIMEOUT_S, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 max_workers: int = 2):
        xgr = import_xgrammar()
        info = xgr.TokenizerInfo(token_bytes, xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=list(eos_token_ids))
        self.vocab_size = vocab_size
        self.key_guard_tokens = KeyGuardTokens(token_bytes)   # json_object: no repeated keys
        self.width = mask_width(vocab_size)
        self.eos_token_ids = list(eos_token_ids)
        self.max_rollback = nextn + 2
        self.compiler = GrammarCompilerService(info, max_workers=max_workers, cache_bytes=cache_bytes,
                                               timeout_s=compile_timeout_s)
        self.tickets: dict[int, CompileTicket] = {}
        self.grammars: dict[int, RequestGrammar] = {}
        self.mask_build_s = 0.0   # host time spent building masks (stats / benchmarks)
        # (seconds from submit to ready/failed, failed) per ticket, newest last (serving metrics drain it)
        self.compile_log: collections.deque[tuple[float, bool]] = collections.deque(maxlen=4096)
        self.num_mask_rows = 0

    # ------------------------------------------------------------------ compile
    def submit(self, request_id: int, spec: StructuredOutput) -> None:
        self.tickets[request_id] = self.compiler.submit(spec)

    def has_pending(self) -> bool:
        return bool(self.tickets)

    def poll(self, wait_s: float = 0.0) -> tuple[list[int], list[tuple[int, str]]]:
        """(request ids whose grammar is ready, [(request id, error)]) among the pending tickets.
        `wait_s` > 0 blocks up to that long for the first ticket (used when nothing else can run)."""
        ready: list[int] = []
        failed: list[tuple[int, str]] = []
        deadline = time.monotonic() + wait_s
        while True:
            now = time.monotonic()
            for rid, ticket in list(self.tickets.items()):
                if not ticket.done(now):
                    continue
                del self.tickets[rid]
                try:
                    guard = KeyGuard(self.key_guard_tokens) if ticket.spec.kind == "json_object" else None
                    self.grammars[rid] = RequestGrammar(ticket.result(now), self.max_rollback, self.eos_token_ids, guard)
                    ready.append(rid)
                    self.compile_log.append((now - ticket.submitted, False))
                except GrammarCompileError as err:
                    failed.append((rid, str(err)))
                    self.compile_log.append((now - ticket.submitted, True))
            if ready or failed or not self.tickets or time.monotonic() >= deadline:
                return ready, failed
            time.sleep(min(0.002, max(0.0, deadline - time.monotonic())))

    def drop(self, request_id: int) -> None:
        self.tickets.pop(request_id, None)
        self.grammars.pop(request_id, None)

    # ------------------------------------------------------------------ per step
    def step_masks(self, out, input_ids: torch.Tensor, device: torch.device | None = None
                   ) -> VocabMasks | None:
        if not self.grammars:
            return None
        start = time.perf_counter()
        rids = out.request_ids
        is_prefill = out.step_kind == StepKind.PREFILL
        if is_prefill:  # logits rows: one per request whose prompt ends in this chunk
            sampled = np.flatnonzero(np.asarray(out.is_last_chunk, dtype=bool))
            first_row = np.arange(sampled.size)
            seqlens = np.ones(sampled.size, np.int64)
            num_rows = int(sampled.size)
        else:
            sampled = np.arange(out.req_cnt)
            first_row = np.asarray(out.first_token_pos, np.int64)
            seqlens = np.asarray(out.seqlens_q, np.int64)
            num_rows = int(out.total_q)
        owners = [(j, self.grammars[int(rids[i])]) for j, i in enumerate(sampled) if int(rids[i]) in self.grammars]
        if not owners:
            return None
        # The host sync: draft tokens (input rows 1.. of each grammar request) -> host.
        draft_rows = [np.arange(first_row[j] + 1, first_row[j] + seqlens[j]) for j, _ in owners if seqlens[j] > 1]
        drafts_host: list[int] = []
        if draft_rows and input_ids.device.type == "cpu":   # already on the host
            drafts_host = input_ids[torch.from_numpy(np.concatenate(draft_rows))].tolist()
        elif draft_rows:
            idx = torch.from_numpy(np.concatenate(draft_rows)).to(input_ids.device)
            drafts_host = input_ids.index_select(0, idx).cpu().tolist()
        n_masks = int(sum(seqlens[j] for j, _ in owners))
        dev = input_ids.device if device is None else device   # where the masks go (input_ids may be a host copy)
        # page-locked on CUDA: its copy to the device is asynchronous (host_copy.py)
        bitmask = torch.empty((n_masks, self.width), dtype=torch.int32, pin_memory=dev.type == "cuda")
        row_mask_ids = np.full(num_rows, NO_VOCAB_MASK, np.int32)
        m = d = 0
        mask_rows, request_drafts = [], []
        for j, _ in owners:
            n = int(seqlens[j])
            mask_rows.append(m)
            request_drafts.append(drafts_host[d: d + n - 1])
            row_mask_ids[first_row[j]: first_row[j] + n] = np.arange(m, m + n, dtype=np.int32)
            m += n
            d += n - 1
        fill_rows_batch([g for _, g in owners], bitmask, mask_rows, request_drafts)
        result = VocabMasks(bitmask.to(dev, non_blocking=True), to_device(torch.from_numpy(row_mask_ids), dev))
        self.mask_build_s += time.perf_counter() - start
        self.num_mask_rows += n_masks
        return result

    def commit(self, request_id: int, emitted: list[int]) -> RequestGrammar | None:
        """Advance request_id's matcher by this step's emitted tokens (raises GrammarStateError)."""
        grammar = self.grammars.get(request_id)
        if grammar is not None:
            grammar.commit(emitted)
        return grammar

    def shutdown(self) -> None:
        self.compiler.shutdown()
