"""Host cost of the text side of the output path per token, early and late in a long output:
incremental detokenization + stop-string search (`RequestState.push_text`, one call per token as
in a decode step). Read the ratio of the two rows: the per-token cost must not grow with the text
already emitted (appending to one growing string did: ~10 us per token at 275K characters).

    pytest packages/deepinfer-engine/benchmarks/bench_output_path.py --benchmark-only -q
"""

import pytest

from deepinfer_engine.detokenizer import IncrementalDetokenizer, TokenTable
from deepinfer_engine.outputs import GenerationOutput
from deepinfer_engine.request_state import RequestState
from deepinfer_engine.sampling_params import SamplingParams
from deepinfer_engine.stop_strings import StopStringMatcher

TABLE = TokenTable([f"w{i} ".encode() for i in range(1000)], set(), True)
STOP = "<never emitted>"
TIMED_TOKENS = 1000


def _state_after(emitted: int) -> RequestState:
    params = SamplingParams(stop=[STOP])
    state = RequestState(0, params, 0, GenerationOutput(request_id=0, prompt=None, prompt_token_ids=[1]))
    state.detokenizer, state.stops = IncrementalDetokenizer(TABLE), StopStringMatcher([STOP])
    state.output.token_ids.extend(i % 1000 for i in range(emitted))
    assert state.push_text(0) is None
    return state


def _push_tokens(state: RequestState) -> RequestState:
    ids = state.output.token_ids
    for i in range(TIMED_TOKENS):
        ids.append(i % 1000)
        assert state.push_text(len(ids) - 1) is None
    return state


@pytest.mark.parametrize("emitted", [1_000, 50_000])
def test_push_text_per_token(benchmark, emitted):
    state = benchmark.pedantic(_push_tokens, setup=lambda: ((_state_after(emitted),), {}), rounds=5,
                               warmup_rounds=1)
    assert state.detokenizer.length == sum(len(f"w{i % 1000} ") for i in range(emitted + TIMED_TOKENS))
    benchmark.extra_info.update(emitted_before=emitted, chars_before=len(state.detokenizer.text) - 5 * TIMED_TOKENS,
                                timed_tokens=TIMED_TOKENS)
