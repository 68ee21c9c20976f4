"""DEEPINFER_* knobs (envs.py): defaults, parsing, and config fields overriding them once
(`EngineConfig.resolve`)."""

import dataclasses
import os

import pytest

from deepinfer_engine import LLM
from deepinfer_engine.config import DEFAULT_BATCHED_TOKENS_CPU, DEFAULT_BATCHED_TOKENS_CUDA, EngineConfig
from deepinfer_engine.envs import Envs


@pytest.fixture
def clean_env(monkeypatch):
    """No DEEPINFER_* variable set, the kernels' knobs included (the engine checks those at start
    too): a test sets what it reads, whatever the shell exported."""
    for name in [n for n in os.environ if n.startswith("DEEPINFER_")]:
        monkeypatch.delenv(name)
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


def test_resolve_takes_each_unset_field_from_its_knob(clean_env):
    for name, value in (("DEEPINFER_USE_NEXTN_DECODE", "2"), ("DEEPINFER_ZERO_OVERHEAD_SCHEDULING", "0"),
                        ("DEEPINFER_COMPILE_DECODE", "1"), ("DEEPINFER_DECODE_STREAMS", "off"),
                        ("DEEPINFER_COMPILE_SPECULATION", "yes"), ("DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL", "16")):
        clean_env.setenv(name, value)
    envs = Envs.from_environ()
    r = EngineConfig().resolve(envs, "cpu")
    assert (r.num_speculative_tokens, r.zero_overhead_scheduling, r.compile_decode, r.decode_streams,
            r.compile_speculation, r.cudagraph_batch_size_interval) == (2, False, True, False, True, 16)
    assert r.max_num_batched_tokens == DEFAULT_BATCHED_TOKENS_CPU and r.envs is envs
    given = EngineConfig(num_speculative_tokens=0, zero_overhead_scheduling=True, compile_decode=False,
                         decode_streams=True, compile_speculation=False, max_num_seqs=3)
    r = given.resolve(envs, "cuda")   # a field set wins over its knob
    assert (r.num_speculative_tokens, r.zero_overhead_scheduling, r.compile_decode, r.decode_streams,
            r.compile_speculation, r.max_num_seqs) == (0, True, False, True, False, 3)
    assert r.max_num_batched_tokens == DEFAULT_BATCHED_TOKENS_CUDA
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.zero_overhead_scheduling = False


def test_batch_invariance_resolves_to_fixed_draft_lengths(clean_env):
    clean_env.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    clean_env.setenv("DEEPINFER_ENABLE_MTP_VARLEN", "1")
    envs = Envs.from_environ()
    assert EngineConfig().resolve(envs, "cpu").enable_mtp_varlen is False
    r = EngineConfig(enable_mtp_varlen=True).resolve(envs, "cpu")
    assert r.enable_mtp_varlen is False and r.batch_invariant is True


def test_resolve_validates_first(clean_env):
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0).resolve(Envs.from_environ(), "cpu")
