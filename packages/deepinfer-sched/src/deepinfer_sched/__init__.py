"""deepinfer_sched: the C++ scheduler and output ledger of DeepInfer (torch-free).

Exchanges Python ints and numpy arrays only. See README.md and docs/design.md.
"""

from ._core import (
    MAX_NEXTN,
    MIN_LOGPROB,
    NO_TOKEN,
    VERIFIED_END,
    FinishReason,
    ForwardRuntimeEstimator,
    LedgerError,
    RequestOutput,
    RequestOutputPool,
    RequestOutputView,
    SamplerRuntimeEstimator,
    SchedulerOutput,
    PrefixCacheStats,
    PrefixMiss,
    SequenceStatus,
    StateSlotPool,
    StepKind,
    prepare_zos_inputs,
)
from .config import RequestParams, SchedulerConfig
from .scheduler import Scheduler
from .sequence import Sequence
from .step_vote import AttemptPoint, decide_step_kind, prefill_attempt_point, step_type_vote

__version__ = "0.1.0"

__all__ = [
    "MAX_NEXTN",
    "MIN_LOGPROB",
    "NO_TOKEN",
    "VERIFIED_END",
    "AttemptPoint",
    "FinishReason",
    "ForwardRuntimeEstimator",
    "LedgerError",
    "RequestOutput",
    "RequestOutputPool",
    "RequestOutputView",
    "RequestParams",
    "SamplerRuntimeEstimator",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "Sequence",
    "PrefixCacheStats",
    "PrefixMiss",
    "SequenceStatus",
    "StateSlotPool",
    "StepKind",
    "decide_step_kind",
    "prefill_attempt_point",
    "prepare_zos_inputs",
    "step_type_vote",
]
