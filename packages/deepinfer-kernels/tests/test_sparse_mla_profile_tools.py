"""diag/sparse_mla_ncu.py (the Nsight Compute table of the sparse MLA decode kernels) on a CSV the
H200 produced on 2026-12-02 (bulk and two since-removed kernels, regs and bulk with two consumers;
132 rows x 2,048 keys over KV blocks of 128; the columns the tool reads), diag/sparse_mla_width_sweep.py's
line fit and diag/sparse_mla_cta_marks.py's marked consumer source."""

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diag"))

import sparse_mla_cta_marks as cta_marks  # noqa: E402
import sparse_mla_ncu as ncu  # noqa: E402
import sparse_mla_width_sweep as sweep  # noqa: E402

H200_CSV = Path(__file__).parent / "data" / "ncu_sparse_mla_decode_h200.csv"
PROFILED = ["bulk", "regs", "bulk_c2"]     # that run's launch order


def test_counters_per_block_from_the_h200_profile():
    rows = ncu.read_raw_csv(H200_CSV)
    assert ncu.label_kernels(rows, PROFILED) == PROFILED
    bulk, regs, c2 = (ncu.summarize(r, lab, 2048 // 64) for r, lab in zip(rows, PROFILED))
    # 9,641,808 ideal shared wavefronts over 132 CTAs x 32 blocks
    assert bulk.ideal_wavefronts_per_block == pytest.approx(9_641_808 / (132 * 32))
    assert bulk.wavefronts_per_block == pytest.approx(10_300_752 / (132 * 32))
    assert bulk.cycles_per_block == pytest.approx(133_459 / 32)
    assert bulk.sm_ghz == pytest.approx(1.3505, abs=1e-3) and bulk.lsu_pipe_pct == pytest.approx(60.48, abs=0.01)
    assert regs.stalls[0][0] == "no_instruction"          # regs waits on instruction fetch first
    assert bulk.stalls[0][0] == "long_scoreboard"
    assert c2.ideal_wavefronts_per_block == pytest.approx(bulk.ideal_wavefronts_per_block, rel=1e-3)
    assert all(v >= w for (_, v), (_, w) in zip(bulk.stalls, bulk.stalls[1:]))


def test_budget_at_80_percent_of_copy():
    # 64 records of 528 B a block; each of 132 SMs streams 0.8 x 4.29 TB/s / 132 = 26.0 B/ns
    budget = ncu.budget_cycles_per_block(4.29, 1.98)
    assert budget == pytest.approx(64 * 528 / (0.8 * 4290 / 132) * 1.98)
    assert 2_500 < budget < 2_650


def test_report_table_names_every_attention_kernel():
    table = ncu.report(H200_CSV, PROFILED, 2048, 4.29, 1.98)
    assert table.count("\n| ") == 1 + 3                  # the rule row + one row a kernel
    assert "| bulk | 98.2 (1.35 GHz) | 4,171 | 2,439 (2,283) | 0.89 |" in table


def test_a_kernel_between_variants_is_labelled_not_counted(tmp_path):
    rows = list(csv.reader(open(H200_CSV)))
    size = rows[0].index("launch__block_size")
    combine = list(rows[4])
    combine[size] = "128"                                 # bulk_c2's split-KV combine follows it
    path = tmp_path / "with_combine.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows + [combine])
    labels = ncu.label_kernels(ncu.read_raw_csv(path), PROFILED)
    assert labels == PROFILED + ["bulk_c2 (other kernel)"]
    assert ncu.report(path, PROFILED, 2048, 4.29, 1.98).count("\n| ") == 4


def test_a_missing_variant_or_metric_fails_loudly(tmp_path):
    rows = ncu.read_raw_csv(H200_CSV)
    with pytest.raises(ValueError, match="2 of the 3"):
        ncu.label_kernels(rows[:2], PROFILED)
    del rows[0]["memory_l1_wavefronts_shared_ideal"]
    with pytest.raises(KeyError, match="memory_l1_wavefronts_shared_ideal"):
        ncu.summarize(rows[0], "bulk", 32)
    with pytest.raises(SystemExit):
        ncu.main(["--variants", "bulk,nope", "--report", str(H200_CSV)])


def test_width_sweep_fit():
    # the H200's bulk times over KV blocks (2026-12-02): 74.9, 140.4, 273.8, 531.4 us
    pts = [(2048, 74.9), (4096, 140.4), (8192, 273.8), (16384, 531.4)]
    share, fixed = sweep.steady_state(pts, 4.29)
    assert 0.50 < share < 0.52 and 8 < fixed < 12
    slope, intercept = sweep.fit_line([(1.0, 3.0), (2.0, 5.0), (4.0, 9.0)])
    assert (slope, intercept) == pytest.approx((2.0, 1.0))
    with pytest.raises(ValueError, match="two distinct"):
        sweep.fit_line([(2048.0, 1.0), (2048.0, 2.0)])
    with pytest.raises(ValueError, match="does not grow"):
        sweep.steady_state([(2048, 5.0), (4096, 4.0)], 4.29)


def test_the_tools_share_one_decode_case():
    import sparse_mla_clock_probe as clock
    import sparse_mla_decode_case as case

    assert set(case.VARIANTS) <= set(ncu.KERNEL_THREADS)   # and the saved profile's removed kernels
    assert ncu.VARIANTS is sweep.VARIANTS is clock.VARIANTS is case.VARIANTS
    with pytest.raises(ValueError, match="layout='blocks'"):
        case.make_decode_case(2048, "blocks", 400_000, pool=None)


def test_cta_marks_patch_the_teams_consumer_once_each():
    from deepinfer_kernels.tilelang._cuda_mma_teams import MMA_TEAMS_SRC

    marked = cta_marks.marked_teams_source(MMA_TEAMS_SRC)
    assert marked.count("di_gt_mark(mark_buf, mark_row, ") == 3       # start, first ready, end
    assert marked.index("mark_row, 1)") < marked.index("for (int i = 0; i < nblk; ++i)") < marked.index("mark_row, 2)")
    assert "void* mark_buf, int mark_row" in marked and marked.rstrip().endswith("#endif")
    with pytest.raises(RuntimeError, match="anchor"):
        cta_marks.marked_teams_source(MMA_TEAMS_SRC.replace("di_mbar_wait_s(a_rdy, 0);", "di_mbar_wait_s(a_rdy, 1);"))
