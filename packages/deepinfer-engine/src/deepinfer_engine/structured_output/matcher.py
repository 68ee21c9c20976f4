"""One request's grammar state: an xgrammar matcher that walks drafts tentatively and rolls back.

Per decode step with drafts d0..d(k-1) (rows 0..k of the request)::

    row 0 mask  = state S            (after every committed token)
    row j mask  = S + d0 .. d(j-1)   (drafts accepted by the grammar, tentatively)
    commit(emitted) : roll back the drafts that were not emitted, accept the rest of `emitted`

A draft the grammar rejects stops the walk: its row's mask forbids it, so verification rejects it
(p = 0) and the rows after it are never used (they repeat the last mask). Rollback never exceeds
`max_rollback` (nextn + 2, SPEC §4): xgrammar >= 0.2 keeps unlimited history, the bound is ours.
"""

from __future__ import annotations

import torch

from deepinfer_engine.structured_output.xgrammar_compat import import_xgrammar


def set_bit(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Allow `token` in packed int32 row `row` (bit token % 32 of word token // 32)."""
    w, b = divmod(token, 32)
    val = (int(bitmask[row, w]) & 0xFFFFFFFF) | (1 << b)
    bitmask[row, w] = val - (1 << 32) if val >= (1 << 31) else val


class GrammarStateError(RuntimeError):
    """An emitted token the grammar does not accept (a mask/ledger disagreement), or a rollback past the bound."""


class RequestGrammar:
    def __init__(self, compiled_grammar, max_rollback: int, eos_token_ids: list[int], key_guard=None):
        xgr = import_xgrammar()
        self.matcher = xgr.GrammarMatcher(compiled_grammar)
        self.key_guard = key_guard    # unique_keys.KeyGuard (json_object: no repeated keys) | None
        self.max_rollback = max_rollback
        self.eos_token_ids = list(eos_token_ids)
        self.pending: list[int] = []  # drafts walked by the last fill_rows, not yet committed
        self.num_committed = 0

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token (EOS) was accepted."""
        return self.matcher.is_terminated()

    def fill_rows(self, bitmask: torch.Tensor, first_row: int, drafts: list[int]) -> None:
        """Masks of rows first_row .. first_row + len(drafts): row j = state after drafts[:j]."""
        fill_rows_batch([self], bitmask, [first_row], [drafts])

    def _fill_eos_only(self, bitmask: torch.Tensor, row: int) -> None:
        """A terminated grammar: only a stop token can follow (its row is never sampled anyway)."""
        bitmask[row] = 0
        for t in self.eos_token_ids:
            set_bit(bitmask, row, t)

    def commit(self, emitted: list[int]) -> None:
        """The tokens the ledger emitted this step (accepted drafts, then the main token)."""
        common = 0
        while common < min(len(self.pending), len(emitted)) and self.pending[common] == emitted[common]:
            common += 1
        back = len(self.pending) - common
        if back > self.max_rollback:
            raise GrammarStateError(f"rollback of {back} tokens exceeds the bound {self.max_rollback}")
        if back:
            self.matcher.rollback(back)
            if self.key_guard is not None:
                self.key_guard.rollback(back)
        self.pending = []
        for t in emitted[common:]:
            if self.matcher.is_terminated() or not self.matcher.accept_token(int(t)):
                raise GrammarStateError(f"token {t} is not accepted by the grammar after {self.num_committed + common} tokens")
            if self.key_guard is not None:
                self.key_guard.push(int(t))
            common += 1
        self.num_committed += len(emitted)


_batch_matcher = None   # xgrammar's multi-threaded batch filler, made on first use


def _fill_batch(grammars: list[RequestGrammar], bitmask: torch.Tensor, rows: list[int]) -> None:
    """Row rows[i] of bitmask = the next-token mask of grammars[i] (one call for the live ones)."""
    _fill_batch_grammar(grammars, bitmask, rows)
    for g, r in zip(grammars, rows):
        if g.key_guard is not None and not g.matcher.is_terminated():
            g.key_guard.restrict(bitmask, r)


def _fill_batch_grammar(grammars: list[RequestGrammar], bitmask: torch.Tensor, rows: list[int]) -> None:
    global _batch_matcher
    live = []
    for g, r in zip(grammars, rows, strict=True):
        if g.matcher.is_terminated():
            g._fill_eos_only(bitmask, r)
        else:
            live.append((g, r))
    if len(live) == 1:
        live[0][0].matcher.fill_next_token_bitmask(bitmask, live[0][1])
    elif live:
        if _batch_matcher is None:
            _batch_matcher = import_xgrammar().BatchGrammarMatcher()
        _batch_matcher.batch_fill_next_token_bitmask([g.matcher for g, _ in live], bitmask, [r for _, r in live])


def fill_rows_batch(grammars: list[RequestGrammar], bitmask: torch.Tensor, first_rows: list[int],
                    drafts: list[list[int]]) -> None:
    """`RequestGrammar.fill_rows` for many requests at once: request i owns rows first_rows[i] ..
    first_rows[i] + len(drafts[i]). The walk goes draft position by draft position, each round one
    batched fill (xgrammar's threads) instead of one Python call per row."""
    for g in grammars:
        if g.pending:  # the last step emitted nothing for this request (pushed 0): none was emitted
            g.commit([])
    last = list(first_rows)                      # each request's last filled row
    _fill_batch(grammars, bitmask, last)
    walking = list(range(len(grammars)))
    for j in range(max((len(d) for d in drafts), default=0)):
        walking = [i for i in walking if j < len(drafts[i]) and not grammars[i].matcher.is_terminated()]
        walking = [i for i in walking if grammars[i].matcher.accept_token(int(drafts[i][j]))]
        for i in walking:
            grammars[i].pending.append(int(drafts[i][j]))
            if grammars[i].key_guard is not None:
                grammars[i].key_guard.push(int(drafts[i][j]))
            last[i] = first_rows[i] + j + 1
        _fill_batch([grammars[i] for i in walking], bitmask, [last[i] for i in walking])
    for i in range(len(grammars)):   # after a grammar-rejected draft: unused rows repeat the last mask
        end = first_rows[i] + len(drafts[i]) + 1
        if last[i] + 1 < end:
            bitmask[last[i] + 1: end] = bitmask[last[i]]
