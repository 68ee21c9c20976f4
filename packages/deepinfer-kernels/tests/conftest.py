"""Fixtures of the kernel package's tests."""

import subprocess

import pytest


@pytest.fixture
def ptxas_report(tmp_path):
    """``ptxas_report(kernel_source)``: nvcc's ptxas report (``-Xptxas -v``: registers, spills) of a
    TileLang kernel's CUDA source compiled for sm_90a with TileLang's headers; fails the test with
    the compiler's output if it does not compile. For the lowering tests' spill checks (they skip
    where nvcc or TileLang is missing)."""
    def report(kernel_source: str) -> str:
        import tilelang

        root = tilelang.__path__[0]
        cu = tmp_path / "kernel.cu"
        cu.write_text(kernel_source)
        out = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-cubin", "-O3", "-Xptxas", "-v", "-w",
                              f"-I{root}/src", f"-I{root}/3rdparty/cutlass/include", "-DENABLE_BF16",
                              "-o", str(tmp_path / "kernel.cubin"), str(cu)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr

    return report
