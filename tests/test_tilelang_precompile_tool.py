"""tools/tilelang_precompile.py --sass: the counts of flagged SASS instructions (no GPU, no TileLang)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from tilelang_precompile import sass_counts  # noqa: E402

SASS = """
        /*0290*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                 /* 0x0000000000007b1d */
        /*03a0*/              @!P1 LDG.E.U16.CONSTANT R2, desc[UR30][R2.64] ;    /* 0x0000001e02029981 */
        /*03b0*/                   LDG.E.128.CONSTANT R4, desc[UR30][R2.64] ;    /* 0x0000001e02029981 */
        /*03c0*/               @P0 STS.U16 [R5+0x310], R7 ;                      /* 0x000fe20000010000 */
        /*29640*/                  CALL.REL.NOINC 0x43330 ;                      /* 0x0000019c00387944 */
        /*29650*/                  MUFU.RCP R3, R2 ;                             /* 0x0000019c00387944 */
        /*29660*/                  STL.64 [R1], R2 ;                             /* 0x0000019c00387944 */
        /*29670*/                  LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;  /* 0x0000019c00387944 */
                                                                                 /* 0x000fe40000000f00 */
"""


def test_flagged_opcodes_are_counted_with_and_without_a_predicate():
    counts = sass_counts(SASS)
    assert counts == {"CALL.REL": 1, "LDG.E.U16": 1, "LDG.E.U8": 0, "STS.U16": 1, "STS.U8": 0, "LDL": 0, "STL": 1,
                      "MUFU.RCP": 1}


def test_a_clean_kernel_counts_nothing():
    assert not any(sass_counts("        /*0000*/   LDG.E.128 R4, desc[UR4][R2.64] ;  /* 0x0 */\n").values())
