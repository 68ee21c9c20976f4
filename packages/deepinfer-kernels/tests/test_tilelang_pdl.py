"""GPU test: programmatic dependent launch (`DEEPINFER_TILELANG_PDL=1`) changes no result.

The switch is read once per process, so the PDL run is a subprocess. It runs a chain in which
every TileLang kernel reads what the kernel before it wrote (add + RMSNorm eight times over the
running sum, the FP8 KV store of the result, sparse MLA over the slots just stored), eagerly and
replayed from a CUDA graph; its outputs must equal this process's (no PDL) bit for bit. A kernel
that touched memory before its `pdl_sync` would read a stale input here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

CHAIN = r'''
import sys, torch
from deepinfer_kernels.tilelang.kv_store import store_kv_fp8_tilelang
from deepinfer_kernels.tilelang.norm import add_rms_norm_tilelang
from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

def chain(x, r, w, pool, slots, q, idx):
    for _ in range(8):
        r, x = add_rms_norm_tilelang(x, r, w, 1e-6)
    store_kv_fp8_tilelang(x, pool, slots)
    out, lse = sparse_mla_attention_tilelang(q, pool, idx, 512 ** -0.5, variant="bulk")
    return x, r, out, lse

g = torch.Generator(device="cuda").manual_seed(5)
rows = 256
x = torch.randn(rows, 512, device="cuda", generator=g).bfloat16()
r = torch.randn(rows, 512, device="cuda", generator=g).bfloat16()
w = torch.rand(512, device="cuda", generator=g) + 0.5
pool = torch.zeros(4096, 528, dtype=torch.uint8, device="cuda")
slots = torch.randperm(4096, device="cuda", generator=g)[:rows]
q = torch.randn(64, 16, 512, device="cuda", generator=g).bfloat16()
idx = slots[torch.randint(0, rows, (64, 192), device="cuda", generator=g)].int()
eager = chain(x, r, w, pool.clone(), slots, q, idx)
static_pool = pool.clone()
chain(x, r, w, static_pool, slots, q, idx)            # warm-up: compiles before the capture
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    graphed = chain(x, r, w, static_pool, slots, q, idx)
static_pool.zero_()
graph.replay()
torch.cuda.synchronize()
torch.save({"eager": [t.cpu() for t in eager], "graphed": [t.cpu() for t in graphed]}, sys.argv[1])
'''


def _run(path: Path, pdl: bool) -> dict:
    env = dict(os.environ, DEEPINFER_TILELANG_PDL="1" if pdl else "0")
    done = subprocess.run([sys.executable, "-c", CHAIN, str(path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(path)


def test_pdl_chain_equals_the_chain_without_pdl(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    base = _run(tmp_path / "base.pt", pdl=False)
    pdl = _run(tmp_path / "pdl.pt", pdl=True)
    for mode in ("eager", "graphed"):
        for a, b in zip(base[mode], pdl[mode], strict=True):
            assert torch.equal(a, b), mode
    for a, b in zip(base["eager"], base["graphed"], strict=True):   # the graph replays the same chain
        assert torch.equal(a, b)
