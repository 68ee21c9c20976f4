
import pytest
import torch

from deepinfer_model.metadata import ForwardMetadata, MetadataError
from deepinfer_model.testing import Driver, Seq, tiny_model


def _meta():
    return ForwardMetadata.build([[5, 6, 7], [8]], [0, 4], [[0], [1]], 8, is_prefill=True,
                                 is_last_chunk=[True, True])


def test_build_is_consistent():
    m = _meta()
    m.validate()
    assert m.first_token_pos.tolist() == [0, 3] and m.positions.tolist() == [0, 1, 2, 4]
    assert m.slot_mapping.tolist() == [0, 1, 2, 12] and m.logit_rows.tolist() == [2, 3]
    assert m.row_to_req.tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize("field,value,match", [
    ("first_token_pos", torch.tensor([0, 2], dtype=torch.int32), "first_token_pos"),
    ("positions", torch.tensor([0, 1, 3, 4]), "positions"),
    ("logit_rows", torch.tensor([4]), "logit_rows"),
    ("row_req", torch.tensor([0, 0, 1, 1]), "row_req"),
    ("row_req", torch.tensor([0, 0, 0, 1], dtype=torch.int32), "row_req"),
])
def test_validate_names_the_field(field, value, match):
    m = _meta()
    setattr(m, field, value)
    with pytest.raises(MetadataError, match=match):
        m.validate()


def test_last_chunk_must_hold_the_replay_segment():
    model = tiny_model()
    drv = Driver(model, num_blocks=8, block_size=8)
    seq = Seq(list(range(4, 44)), prompt_len=40)
    drv.prefill([seq], [30])
    with pytest.raises(MetadataError, match="last prefill chunk must hold"):
        drv.prefill([seq], [10])        # 10 < min(W=16, 40)


def test_staged_row_req_is_what_the_forward_reads_and_padding_extends_it():
    """Graph buffers stage each row's request on the host (no repeat_interleave in the step):
    `row_to_req` returns it as given, and `pad_decode` gives the padding rows the padding request."""
    m = ForwardMetadata.build([[5], [8]], [3, 4], [[0], [1]], 8, is_prefill=False)
    staged = torch.tensor([0, 1])
    m.row_req = staged
    m.validate()
    assert m.row_to_req is staged
    p = m.pad_decode(4, 5)
    p.validate()
    assert p.row_to_req.tolist() == [0, 1, 4, 4]


def test_logits_every_row_reads_the_rows_in_place():
    """A decode step whose logit rows are all its rows in order (`logits_every_row`: the runner and the
    graph buffers set it) projects x as it is: the same logits, bit for bit, as the gather through
    `logit_rows`; padding keeps the flag, and `validate` rejects it beside other logit rows."""
    import dataclasses

    model = tiny_model()
    drv = Driver(model, num_blocks=16, block_size=8)
    seqs = [Seq(list(range(4, 24)), 20), Seq(list(range(30, 41)), 11)]
    _, out = drv.prefill(seqs, [20, 11])
    for s, lg in zip(seqs, out.logits, strict=True):
        s.tokens.append(int(lg.argmax()))
    meta = drv.decode_meta(seqs, [[7, 9], []])
    assert meta.logits_every_row and meta.logit_rows.tolist() == [0, 1, 2, 3]
    in_place = model.forward(meta, drv.cache).logits
    gathered = model.forward(dataclasses.replace(meta, logits_every_row=False), drv.cache).logits
    assert in_place.dtype == torch.float32 and torch.equal(in_place, gathered)
    padded = meta.pad_decode(6, 4)
    padded.validate()
    assert padded.logits_every_row
    bad = dataclasses.replace(meta, logit_rows=torch.tensor([0, 2, 1, 3]))
    with pytest.raises(MetadataError, match="logits_every_row"):
        bad.validate()
    assert not ForwardMetadata.build([[5], [8]], [3, 4], [[0], [1]], 8, is_prefill=False).logits_every_row
