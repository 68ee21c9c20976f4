"""The kernels package's DEEPINFER_* knobs (envs.py): strict parsing, defaults, one error shape."""

import pytest

from deepinfer_kernels.envs import (
    KERNEL_BACKEND_ENV,
    MATVEC_ENV,
    MOE_GATEUP_WS_ENV,
    SPARSE_MLA_GROUP_ROWS_ENV,
    SPARSE_MLA_SHARED_KEYS_ENV,
    SPARSE_MLA_VARIANT_ENV,
    TILELANG_PDL_ENV,
    KernelEnvs,
    env_flag,
)

KNOBS = (KERNEL_BACKEND_ENV, SPARSE_MLA_VARIANT_ENV, SPARSE_MLA_SHARED_KEYS_ENV, SPARSE_MLA_GROUP_ROWS_ENV,
         MATVEC_ENV, TILELANG_PDL_ENV, MOE_GATEUP_WS_ENV)


@pytest.fixture
def clean_env(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults(clean_env):
    assert KernelEnvs.from_environ() == KernelEnvs(kernel_backend="", sparse_mla_variant="auto",
                                                   sparse_mla_shared_keys=True, sparse_mla_group_rows=4,
                                                   matvec=True, tilelang_pdl=False, moe_gateup_ws=False)


def test_values_are_read(clean_env):
    for name, value in ((KERNEL_BACKEND_ENV, "Torch"), (SPARSE_MLA_VARIANT_ENV, "bulk"),
                        (SPARSE_MLA_SHARED_KEYS_ENV, "off"), (SPARSE_MLA_GROUP_ROWS_ENV, "2"), (MATVEC_ENV, "0"),
                        (TILELANG_PDL_ENV, "yes"), (MOE_GATEUP_WS_ENV, "true")):
        clean_env.setenv(name, value)
    e = KernelEnvs.from_environ()
    assert (e.kernel_backend, e.sparse_mla_variant, e.sparse_mla_shared_keys, e.sparse_mla_group_rows) == (
        "torch", "bulk", False, 2)
    assert (e.matvec, e.tilelang_pdl, e.moe_gateup_ws) == (False, True, True)


@pytest.mark.parametrize("name,value", [(KERNEL_BACKEND_ENV, "cuda"), (SPARSE_MLA_VARIANT_ENV, "fast"),
                                        (SPARSE_MLA_SHARED_KEYS_ENV, "2"), (SPARSE_MLA_GROUP_ROWS_ENV, "8"),
                                        (MATVEC_ENV, "maybe"), (TILELANG_PDL_ENV, "enabled"),
                                        (MOE_GATEUP_WS_ENV, "-1")])
def test_a_bad_value_names_the_variable_and_the_choices(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='{value}': expected one of"):
        KernelEnvs.from_environ()


def test_flags_take_the_engines_spellings_and_nothing_else(clean_env):
    for value, want in (("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False), ("No", False),
                        ("", True), (" ", True)):
        clean_env.setenv(MATVEC_ENV, value)
        assert env_flag(MATVEC_ENV, True) is want, value
    clean_env.setenv(MATVEC_ENV, "false")      # once read as on (anything but "0")
    assert env_flag(MATVEC_ENV, True) is False


def test_the_backend_knob_is_read_inside_a_compiled_step(clean_env):
    """`select_backend` runs inside torch.compile'd decode steps: reading the backend knob there
    must trace without a graph break (torch 2.11's dynamo could not iterate the Backend enum
    class, which broke compile_decode and compile_speculation on the H200)."""
    import torch

    from deepinfer_kernels.platform import BACKEND_CHOICES, Backend, select_backend

    assert set(BACKEND_CHOICES) == {""} | {b.value for b in Backend}

    def step(x):
        return x + 1 if select_backend("store_kv_fp8", x.device) is Backend.TORCH else x - 1

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))
    clean_env.setenv(KERNEL_BACKEND_ENV, "torch")
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))
