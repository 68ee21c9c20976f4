"""GPU: a decode step with its independent chains on side streams (engine/streams.py) gives the
same logits, DSpark features and cache contents, bit for bit, as on one stream: eager, and
captured in a CUDA graph and replayed over new batches."""

import pytest
import torch

from deepinfer_model.paged.streams import DecodeStreams
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import tiny
from deepinfer_model.testing import Driver, Seq, caches_equal, clone_cache

BUCKET_ROWS = 32
MAX_BLOCKS = 16


def _setup():
    from deepinfer_kernels.platform import current_platform
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if not current_platform().is_sm90:
        pytest.skip("the capturable MoE path (torch._grouped_mm) runs on SM90")
    dev = torch.device("cuda")
    model = V41ForCausalLM(tiny(), device=dev).init_random_weights(0).eval()      # bf16
    g = torch.Generator().manual_seed(0)
    seqs = [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in (40, 9, 23, 17, 30, 5, 61)]
    drv = Driver(model, num_blocks=96, block_size=8)
    _, out = drv.prefill(seqs, [s.prompt_len for s in seqs])
    for s, t in zip(seqs, out.logits.argmax(-1).tolist(), strict=True):
        s.tokens.append(t)
    return model, drv, seqs, g


def _forward(model, meta, cache, streams: bool):
    model.decode_streams = streams
    try:
        return model.forward(meta, cache)
    finally:
        model.decode_streams = False


def test_decode_streams_are_used_only_where_they_are_safe():
    model = V41ForCausalLM(tiny())
    model.decode_streams = True
    assert DecodeStreams.usable(model, decode=True)
    assert not DecodeStreams.usable(model, decode=False)               # prefill reads entries it closes
    assert not DecodeStreams(torch.device("cpu"), True).enabled        # no streams off the GPU
    model.decode_streams = False
    assert not DecodeStreams.usable(model, decode=True)


@pytest.mark.gpu
@torch.no_grad()
def test_decode_streams_eager_equal_one_stream_bit_for_bit():
    model, drv, seqs, g = _setup()
    for step in range(6):   # steps with draft rows: rows of one request close entries the others do not read
        drafts = [[int(t) for t in torch.randint(4, 8192, (d,), generator=g)] for d in (0, 3, 5, 1, 0, 2, 4)]
        meta = drv.decode_meta(seqs, drafts, features=True)
        one_cache = clone_cache(drv.cache)
        one = _forward(model, meta, one_cache, streams=False)
        side = _forward(model, meta, drv.cache, streams=True)
        torch.cuda.synchronize()
        assert torch.equal(side.logits, one.logits), step
        assert torch.equal(side.dspark_features, one.dspark_features), step
        assert caches_equal(drv.cache, one_cache), step
        first_rows = torch.tensor([0] + [1 + len(d) for d in drafts[:-1]]).cumsum(0).tolist()
        for s, r in zip(seqs, first_rows, strict=True):   # commit each request's next token (drafts rejected)
            s.tokens.append(int(side.logits[r].argmax()))


@pytest.mark.gpu
@torch.no_grad()
def test_decode_streams_captured_graph_replays_like_one_stream_eager():
    model, drv, seqs, g = _setup()

    def batch(idx, drafts):
        ss = [seqs[i] for i in idx]
        m = drv.decode_meta(ss, [[int(t) for t in torch.randint(4, 8192, (d,), generator=g)] for d in drafts],
                            features=True, max_blocks=MAX_BLOCKS)
        return m.pad_decode(BUCKET_ROWS)

    batches = [batch([0, 1, 2, 3, 4], [1, 0, 3, 2, 0]), batch([6, 5, 3, 2, 1, 0, 4], [0, 2, 5, 1, 1, 0, 3])]
    static = ForwardMetadata(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(batches[0]).items()})
    cache = drv.cache
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the graph
        for _ in range(2):
            _forward(model, static, cache, streams=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    model.decode_streams = True
    with torch.cuda.graph(graph):
        s_out = model.forward(static, cache)
    model.decode_streams = False
    for m in batches:
        for name, v in vars(m).items():
            if isinstance(v, torch.Tensor):
                getattr(static, name).copy_(v)
        eager_cache = clone_cache(cache)
        graph.replay()
        e_out = _forward(model, m, eager_cache, streams=False)
        torch.cuda.synchronize()
        assert torch.equal(s_out.logits, e_out.logits)
        assert torch.equal(s_out.dspark_features, e_out.dspark_features)
        assert caches_equal(cache, eager_cache)
