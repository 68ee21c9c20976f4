"""One request's failure never breaks the engine: its state is removed, its output says why.

The checks in `SamplingParams.validate` / `LLMEngine.validate_request` reject bad input before
anything is queued. What still raises afterwards is turned into error outputs here:

1. while a request is being added (`guarded_add`): every piece of state the partial add left
   (Python side, grammar ticket, ledger entry) is removed and `RequestFailedError` is raised, which
   `LLM.generate` reports as that request's output;
2. while one request's output is processed (`OutputProcessor.fail_request`): that request
   finishes with `finish_reason == "error"`; the others in the step carry on;
3. in a step that raises outside any one request (`guarded_step`): the step cannot say whose input
   caused it, so the requests it was running (admitted into the scheduler and started) fail with
   the error; requests still waiting or compiling their grammar keep going, and so does the engine.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, Protocol

from deepinfer_engine.errors import RequestError, RequestFailedError
from deepinfer_engine.outputs import GenerationOutput

logger = logging.getLogger("deepinfer")


class GuardedEngine(Protocol):
    """What the guards touch of LLMEngine (its OutputProcessor owns the per-request state:
    `discard_request` / `fail_request`)."""
    output_processor: Any
    _next_request_id: int
    _inflight: Any


def describe(err: BaseException) -> str:
    """`TypeName: message`, one line (the user-facing part of an unexpected exception)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def guarded_add(engine: GuardedEngine, add, prompt, prompt_token_ids, params) -> int:
    """`add(prompt, prompt_token_ids, params)` (the unguarded add_request); any exception other
    than the request's own RequestError removes what the partial add left and becomes
    RequestFailedError."""
    first_id = engine._next_request_id
    try:
        return add(prompt, prompt_token_ids, params)
    except RequestError:
        for rid in range(first_id, engine._next_request_id):
            engine.output_processor.discard_request(rid)
        raise
    except Exception as err:
        for rid in range(first_id, engine._next_request_id):
            engine.output_processor.discard_request(rid)
        logger.warning("request could not be queued: %s", "".join(traceback.format_exception(err)).strip())
        raise RequestFailedError(f"could not be queued: {describe(err)}") from err


def guarded_step(engine: GuardedEngine, step) -> list[GenerationOutput]:
    """`step()` (the unguarded engine step); when it raises, the requests it was running fail with
    the error and the engine is left ready for the next step."""
    try:
        return step()
    except Exception as err:
        logger.error("engine step failed; failing the requests it ran: %s",
                     "".join(traceback.format_exception(err)).strip())
        engine._inflight = None
        processor = engine.output_processor
        requests = processor.requests
        running = [rid for rid, state in list(requests.items()) if state.prefill_started]
        if not running:   # it failed before any request started: fail the admitted ones
            running = [rid for rid in list(requests) if not processor.is_held(rid)]
        message = f"engine step failed: {describe(err)}"
        return [processor.fail_request(rid, message) for rid in running]
