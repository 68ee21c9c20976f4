"""One request's failure never breaks the engine: its state is removed, its output says why.

The checks in `SamplingParams.validate` / `LLMEngine.validate_request` reject bad input before
anything is queued. What still raises afterwards is turned into error outputs here:

1. while a request is being added (`guarded_add`): every piece of state the partial add left
   (Python side, grammar ticket, ledger entry) is removed and `RequestFailedError` is raised, which
   `LLM.generate` reports as that request's output;
2. while one request's output is processed (`fail_request`, from the output path): that request
   finishes with `finish_reason == "error"`; the others in the step carry on;
3. in a step that raises outside any one request (`guarded_step`): the step cannot say whose input
   caused it, so the requests it was running (admitted into the scheduler and started) fail with
   the error; requests still waiting or compiling their grammar keep going, and so does the engine.
"""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING

from deepinfer_engine.errors import RequestError, RequestFailedError
from deepinfer_engine.outputs import GenerationOutput
from deepinfer_engine.request_state import FINISH_REASON_ERROR

if TYPE_CHECKING:
    from deepinfer_engine.llm_engine import LLMEngine
    from deepinfer_engine.output_processor import OutputProcessor

logger = logging.getLogger("deepinfer")


def describe(err: BaseException) -> str:
    """`TypeName: message`, one line (the user-facing part of an unexpected exception)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def discard_request(processor: OutputProcessor, request_id: int) -> None:
    """Remove every piece of state a request has, wherever it got to. Idempotent."""
    processor.requests.pop(request_id, None)
    processor._held.pop(request_id, None)
    if processor.penalties is not None:
        processor.penalties.release(request_id)
    if processor.structured is not None:
        processor.structured.drop(request_id)
    try:
        if processor.scheduler.abort_request(request_id):
            processor._finished_here.add(request_id)   # its "abort" echo next step is dropped
    except Exception:  # noqa: BLE001 - never admitted: nothing to abort
        pass


def fail_request(processor: OutputProcessor, request_id: int, message: str) -> GenerationOutput:
    """Finish one live request with `finish_reason == "error"` (error "request: <message>") and
    remove its state."""
    message = f"request: {message}"
    state = processor.requests.get(request_id)
    discard_request(processor, request_id)
    if state is None:
        return GenerationOutput(request_id, None, [], finish_reason=FINISH_REASON_ERROR, error=message)
    out = state.output
    out.finish_reason, out.error = FINISH_REASON_ERROR, message
    if state.detokenizer is not None:
        try:
            out.text = state.final_text()
        except Exception:  # noqa: BLE001 - the text is a courtesy; the error is the output
            out.text = None
    processor._emit_delta(state, finished=True)
    return out


def guarded_add(engine: LLMEngine, add, prompt, prompt_token_ids, params) -> int:
    """`add(prompt, prompt_token_ids, params)` (the unguarded add_request); any exception other
    than the request's own RequestError removes what the partial add left and becomes
    RequestFailedError."""
    first_id = engine._next_request_id
    try:
        return add(prompt, prompt_token_ids, params)
    except RequestError:
        for rid in range(first_id, engine._next_request_id):
            discard_request(engine.output_processor, rid)
        raise
    except Exception as err:
        for rid in range(first_id, engine._next_request_id):
            discard_request(engine.output_processor, rid)
        logger.warning("request could not be queued: %s", "".join(traceback.format_exception(err)).strip())
        raise RequestFailedError(f"could not be queued: {describe(err)}") from err


def guarded_step(engine: LLMEngine, step) -> list[GenerationOutput]:
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
        return [fail_request(processor, rid, message) for rid in running]
