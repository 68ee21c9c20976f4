"""Past one GPU: DP attention ranks with expert-parallel MoE (docs/parallel.md).

front_end.py (spawns the ranks, load balance) -> worker.py (one rank: LLMEngine + the step vote
of group_vote.py + EPLB of eplb_runtime.py); the model transform is deepinfer_model.parallel.
"""

from deepinfer_engine.parallel.front_end import DataParallelEngine, RankFailedError

__all__ = ["DataParallelEngine", "RankFailedError"]
