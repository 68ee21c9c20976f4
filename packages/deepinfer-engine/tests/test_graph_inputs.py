"""graph_inputs.py: a step's host arrays staged into the decode graphs' packed buffers, and the ZOS
fix-up the whole-step graph applies to them (decode_step.apply_remap)."""

import numpy as np
import pytest
import torch

from deepinfer_engine import graph_inputs
from deepinfer_engine.decode_step import StepCarry, apply_remap
from deepinfer_engine.graph_inputs import GraphInputBuffers, StagedStep
from deepinfer_model.metadata import ForwardMetadata

BLOCK = 4


def _step(seqlens, ctx, remap, first_unknown=True) -> StagedStep:
    """Requests of `seqlens` rows ending at context `ctx`; block table of request i: blocks 10 i + j."""
    seqlens, ctx = np.asarray(seqlens, np.int32), np.asarray(ctx, np.int32)
    ftp = np.concatenate([[0], np.cumsum(seqlens)[:-1]]).astype(np.int32)
    positions = np.concatenate([np.arange(c - s, c) for s, c in zip(seqlens, ctx)]).astype(np.int64)
    width = int(max(ctx) // BLOCK + 2)
    tables = np.array([[10 * i + j for j in range(width)] for i in range(len(seqlens))], np.int32)
    row_req = np.repeat(np.arange(len(seqlens)), seqlens)
    slots = tables[row_req, positions // BLOCK].astype(np.int64) * BLOCK + positions % BLOCK
    ids = np.arange(100, 100 + positions.size, dtype=np.int64)
    if first_unknown:
        ids[ftp[np.asarray(remap) >= 0]] = -1      # the golden token of a continuing request: last step's
    n = len(seqlens)
    return StagedStep(input_ids=ids, positions=positions, slot_mapping=slots, seqlens_q=seqlens,
                      first_token_pos=ftp, context_lens=ctx, block_tables=tables,
                      remap=np.asarray(remap, np.int64), temperature=np.linspace(0, 1, n).astype(np.float32),
                      seeds=np.arange(n, dtype=np.int64) + 7, mtp_slots=np.arange(n, dtype=np.int32) + 1)


def _meta(b: GraphInputBuffers, g: int, s: int) -> ForwardMetadata:
    return ForwardMetadata(input_ids=b.input_ids[:g], positions=b.positions[:g], seqlens_q=b.seqlens[:s],
                           first_token_pos=b.ftp[:s], context_lens=b.context_lens[:s], block_tables=b.block_tables[:s],
                           slot_mapping=b.slot_mapping[:g], block_size=BLOCK, is_prefill=False,
                           is_last_chunk=torch.ones(s, dtype=torch.bool), logit_rows=torch.arange(g))


def test_stage_pads_the_step_into_the_bucket_layout():
    b = GraphInputBuffers(max_rows=16, max_slots=6, max_blocks=8, device=torch.device("cpu"))
    step = _step([1, 3], [9, 6], [-1, -1], first_unknown=False)
    b.stage(8, 5, step)
    b.upload()
    assert b.input_ids[:8].tolist() == [100, 101, 102, 103, 0, 0, 0, 0]
    assert b.positions[:8].tolist() == [8, 3, 4, 5, 0, 1, 2, 3]             # padding rows count from 0
    assert b.slot_mapping[4:8].tolist() == [-1] * 4
    assert b.seqlens[:5].tolist() == [1, 3, 0, 0, 4]                        # empty slots, then the padding request
    assert b.ftp[:5].tolist() == [0, 1, 4, 4, 4]
    assert b.context_lens[:5].tolist() == [9, 6, 0, 0, 4]
    assert (b.block_tables[2:5] == -1).all() and (b.block_tables[:2, 4:] == -1).all()
    assert b.block_tables[1, :4].tolist() == [10, 11, 12, 13]
    assert b.remap[:5].tolist() == [-1] * 5
    assert b.temperature[:5].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert b.seeds[:5].tolist() == [7, 8, 0, 0, 0] and b.mtp_slots[:5].tolist() == [1, 2, 0, 0, 0]
    # a smaller step after it leaves nothing of the first in the bucket's view
    b.stage(8, 5, _step([2], [3], [-1], first_unknown=False))
    b.upload()
    assert b.seqlens[:5].tolist() == [2, 0, 0, 0, 6] and b.temperature[:5].tolist() == [0.0] * 5


def test_stage_padding_is_the_padding_of_stage():
    """What the piecewise / grammar steps' `_fill` does: the padding staged around a step of t rows
    and r requests (over stale mirrors), uploaded, then the step's own rows copied over on the
    device: the forward's buffers equal those a whole step stages for the same step."""
    fields = ("input_ids", "positions", "slot_mapping", "seqlens", "ftp", "context_lens", "block_tables")
    step = _step([2, 3], [7, 12], [-1, -1], first_unknown=False)
    want = GraphInputBuffers(max_rows=16, max_slots=6, max_blocks=8, device=torch.device("cpu"))
    want.stage(8, 5, step)
    want.upload()
    got = GraphInputBuffers(max_rows=16, max_slots=6, max_blocks=8, device=torch.device("cpu"))
    got.stage(16, 6, _step([4, 4, 4, 1], [20, 9, 5, 17], [-1] * 4, first_unknown=False))   # stale contents
    got.upload()
    t, r, w = 5, 2, step.block_tables.shape[1]
    got.note_table_width(w)
    got.stage_padding(8, 5, t, r)
    got.upload()
    for name, arr in (("input_ids", step.input_ids), ("positions", step.positions), ("slot_mapping", step.slot_mapping)):
        getattr(got, name)[:t].copy_(torch.from_numpy(arr))
    for name, arr in (("seqlens", step.seqlens_q), ("ftp", step.first_token_pos), ("context_lens", step.context_lens)):
        getattr(got, name)[:r].copy_(torch.from_numpy(arr))
    got.block_tables[:r, :w].copy_(torch.from_numpy(step.block_tables))
    got.block_tables[:r, w:].fill_(-1)
    for name in fields:
        n = 8 if name in ("input_ids", "positions", "slot_mapping") else 5
        assert torch.equal(getattr(got, name)[:n], getattr(want, name)[:n]), name


def _carry(b: GraphInputBuffers, g: int, s: int, tokens, rejected, rows_move=True) -> StepCarry:
    return StepCarry(b.remap[:s], b.prev_row[:g], b.row_remap[:g], b.row_req[:g], torch.tensor(tokens),
                     torch.tensor(rejected), rows_move=rows_move)


def test_stage_maps_rows_to_requests_and_carried_tokens():
    b = GraphInputBuffers(max_rows=16, max_slots=6, max_blocks=8, device=torch.device("cpu"))
    step = _step([3, 2, 1], [12, 2, 9], [2, -1, 0])   # first rows of requests 0 and 2 wait for last step's token
    b.stage(8, 5, step)
    b.upload()
    assert b.row_req[:8].tolist() == [0, 0, 0, 1, 1, 2, 4, 4]
    assert b.row_remap[:8].tolist() == [2, 2, 2, -1, -1, 0, -1, -1]
    assert b.prev_row[:8].tolist() == [2, -1, -1, -1, -1, 0, -1, -1]


@pytest.mark.parametrize("rejected", [[0, 0, 0], [2, 0, 1]], ids=["no-drafts", "rejected-drafts"])
def test_apply_remap_follows_the_previous_step(rejected):
    """Request 0 continues previous request 2, request 1 is new, request 2 continues previous 0:
    golden tokens come from the previous step, rows move back by what it rejected, slots follow."""
    b = GraphInputBuffers(max_rows=48, max_slots=6, max_blocks=8, device=torch.device("cpu"))
    step = _step([3, 2, 3], [12, 2, 9], [2, -1, 0])
    g, s = 48, 6   # padding rows at positions 0..39: past the 8-block tables (blocks of 4)
    b.stage(g, s, step)
    b.upload()
    meta = apply_remap(_meta(b, g, s), _carry(b, g, s, [501, 502, 503, 0, 0, 0], rejected + [0, 0, 0]))
    delta = np.array([rejected[2], 0, rejected[0], 0, 0, 0])
    want_ids = step.input_ids.copy()
    want_ids[0], want_ids[5] = 503, 501
    assert meta.input_ids[:8].tolist() == want_ids.tolist()
    row_delta = np.repeat(delta[:3], step.seqlens_q)
    want_pos = step.positions - row_delta
    assert meta.positions[:8].tolist() == want_pos.tolist()
    row_req = np.repeat(np.arange(3), step.seqlens_q)
    want_slots = step.block_tables[row_req, want_pos // BLOCK] * BLOCK + want_pos % BLOCK
    assert meta.slot_mapping[:8].tolist() == want_slots.tolist()
    assert meta.context_lens[:3].tolist() == (step.context_lens - delta[:3]).tolist()
    # padding rows and the padding request are untouched
    assert meta.slot_mapping[8:].tolist() == [-1] * 40 and meta.positions[8:].tolist() == list(range(40))
    assert meta.context_lens[5].item() == 40


def test_apply_remap_without_speculation_carries_tokens_only():
    """rows_move=False (no draft head: no step rejects rows): the tokens are filled in, nothing
    else is computed (positions, slots and context are the buffers' own)."""
    b = GraphInputBuffers(max_rows=16, max_slots=6, max_blocks=8, device=torch.device("cpu"))
    step = _step([1, 1, 1], [12, 2, 9], [1, -1, 0])
    b.stage(8, 4, step)
    b.upload()
    meta = _meta(b, 8, 4)
    fixed = apply_remap(meta, _carry(b, 8, 4, [601, 602, 0, 0, 0, 0], [0] * 6, rows_move=False))
    assert fixed.input_ids[:3].tolist() == [602, step.input_ids[1], 601]
    assert fixed.positions is meta.positions and fixed.slot_mapping is meta.slot_mapping
    assert fixed.context_lens is meta.context_lens


@pytest.mark.parametrize("full_rows_max_bytes", [0, 1 << 20], ids=["widest-table", "whole-rows"])
def test_block_tables_upload_covers_the_widest_table_so_far(full_rows_max_bytes, monkeypatch):
    """Only the staged slots' rows go, whole or as wide as the widest table written so far (large
    pools): a narrower step after a wider one still clears the wider one's columns; columns never
    written stay -1."""
    monkeypatch.setattr(graph_inputs, "FULL_ROWS_MAX_BYTES", full_rows_max_bytes)
    b = GraphInputBuffers(max_rows=16, max_slots=6, max_blocks=64, device=torch.device("cpu"))
    b.stage(8, 5, _step([1, 1], [24, 9], [-1, -1], first_unknown=False))    # 8 columns
    b.upload()
    assert b.block_tables[0, :8].tolist() == list(range(8)) and (b.block_tables[:, 8:] == -1).all()
    b.stage(8, 5, _step([1], [5], [-1], first_unknown=False))               # 3 columns
    b.upload()
    assert b.block_tables[0, :3].tolist() == [0, 1, 2] and (b.block_tables[0, 3:] == -1).all()
    assert (b.block_tables[1:5] == -1).all()
    b.note_table_width(40)               # a device-side fill wrote 40 columns: uploads cover them
    b.block_tables[2, 30:40] = 7
    b.stage(4, 3, _step([1], [5], [-1], first_unknown=False))
    b.upload()
    assert (b.block_tables[2] == -1).all()
