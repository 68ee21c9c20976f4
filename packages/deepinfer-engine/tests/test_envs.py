"""DEEPINFER_* knobs (envs.py): defaults, parsing, and config fields overriding them."""

import pytest

from deepinfer_engine import LLM
from deepinfer_engine.envs import Envs

KNOBS = ("DEEPINFER_USE_NEXTN_DECODE", "DEEPINFER_ENABLE_MTP_VARLEN", "DEEPINFER_ZERO_OVERHEAD_SCHEDULING",
         "DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL", "DEEPINFER_COMPILE_DECODE", "DEEPINFER_COMPILE_SPECULATION",
         "DEEPINFER_BATCH_INVARIANT", "DEEPINFER_MAX_BACKTRACKING_TOKENS", "DEEPINFER_DECODE_STREAMS")


@pytest.fixture
def clean_env(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults(clean_env):
    e = Envs.from_environ()
    assert e.use_nextn_decode == 5 and e.max_backtracking_tokens == 6
    assert e.enable_mtp_varlen is False            # fixed-length verification unless asked (docs/benchmarks.md)
    assert e.zero_overhead_scheduling is True and e.cudagraph_batch_size_interval == 8
    assert not (e.compile_decode or e.compile_speculation or e.batch_invariant)
    assert e.decode_streams is True


def test_bad_values_name_the_variable(clean_env):
    clean_env.setenv("DEEPINFER_ENABLE_MTP_VARLEN", "maybe")
    with pytest.raises(ValueError, match="DEEPINFER_ENABLE_MTP_VARLEN='maybe'"):
        Envs.from_environ()
    clean_env.setenv("DEEPINFER_ENABLE_MTP_VARLEN", "1")
    clean_env.setenv("DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL", "0")
    with pytest.raises(ValueError, match="DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL=0: must be >= 1"):
        Envs.from_environ()


def test_engine_reads_varlen_from_the_environment_unless_configured(clean_env):
    kw = dict(device="cpu", max_num_seqs=2, max_model_len=256)
    assert LLM(**kw).engine.budget.varlen is False
    clean_env.setenv("DEEPINFER_ENABLE_MTP_VARLEN", "1")
    assert LLM(**kw).engine.budget.varlen is True
    assert LLM(enable_mtp_varlen=False, **kw).engine.budget.varlen is False


def test_engine_sets_decode_streams_from_the_environment_unless_configured(clean_env):
    kw = dict(device="cpu", max_num_seqs=2, max_model_len=256)
    assert LLM(**kw).engine.model.decode_streams is True      # used on CUDA decode steps only (streams.py)
    clean_env.setenv("DEEPINFER_DECODE_STREAMS", "0")
    assert LLM(**kw).engine.model.decode_streams is False
    assert LLM(decode_streams=True, **kw).engine.model.decode_streams is True


def test_a_bad_kernel_knob_fails_at_engine_start(clean_env):
    """The kernels package's knobs are checked with the engine's: a typo fails when the engine is
    built, naming the variable, instead of in the first prefill step that reads it."""
    clean_env.setenv("DEEPINFER_SPARSE_MLA_GROUP_ROWS", "3")
    with pytest.raises(ValueError, match="DEEPINFER_SPARSE_MLA_GROUP_ROWS='3'"):
        LLM(device="cpu", max_num_seqs=2, max_model_len=256)
    clean_env.setenv("DEEPINFER_SPARSE_MLA_GROUP_ROWS", "2")
    assert LLM(device="cpu", max_num_seqs=2, max_model_len=256).engine.envs.kernels.sparse_mla_group_rows == 2
