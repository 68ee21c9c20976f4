"""`LLM`: the offline entry point. `LLM().generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from deepinfer_engine.config import EngineConfig
from deepinfer_engine.errors import RequestError
from deepinfer_engine.llm_engine import LLMEngine
from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.request_state import FINISH_REASON_ERROR
from deepinfer_engine.sampling_params import SamplingParams


class LLM:
    """Offline batch generation.

    >>> llm = LLM()                                   # embedded default model
    >>> out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=32))[0]
    >>> out.text, out.finish_reason
    """

    def __init__(self, model: str | Path | None = None, data_parallel_size: int = 1, expert_parallel: bool = False,
                 **engine_args):
        if data_parallel_size > 1:   # one process per rank (deepinfer_engine/parallel, docs/parallel.md)
            from deepinfer_engine.parallel import DataParallelEngine
            self.engine = DataParallelEngine(data_parallel_size, expert_parallel, model=model, **engine_args)
            return
        if expert_parallel:
            raise ValueError("expert_parallel: needs data_parallel_size >= 2 (EP runs over the DP ranks)")
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerationOutput]:
        """One output per prompt, in input order. A request with invalid input gets an output with
        `finish_reason == "error"` and `error` naming the field; every other request runs normally."""
        items, params = _requests("generate", prompts, sampling_params, prompt_token_ids)

        results: list[GenerationOutput | None] = [None] * len(items)
        slot_of: dict[int, int] = {}
        try:
            for i, ((text, ids), p) in enumerate(zip(items, params)):
                try:
                    slot_of[self.engine.add_request(text, ids, p)] = i
                except RequestError as err:
                    results[i] = _rejected(text, ids, err)
            bar = tqdm(total=len(slot_of), desc="generate", unit="req", disable=not use_tqdm or len(slot_of) < 2)
            pending = set(slot_of)
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.request_id in pending:   # (another caller's request is not ours to return)
                        pending.discard(out.request_id)
                        results[slot_of[out.request_id]] = out
                        bar.update(1)
            bar.close()
            for rid in pending:   # never expected: the engine has nothing left but owes an output
                results[slot_of[rid]] = self.engine.fail_request(rid, "the engine stopped without finishing it")
        finally:   # interrupted (KeyboardInterrupt, ...): this call's requests leave the engine
            for rid, i in slot_of.items():
                if results[i] is None:
                    self.engine.discard_request(rid)
        return results  # type: ignore[return-value]

    def generate_stream(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> Iterator[StreamDelta]:
        """Like `generate`, but yields each request's progress step by step as StreamDelta
        (`index` = position in the input). Per request, the text deltas concatenate to the final
        text exactly: bytes of an unfinished UTF-8 character and text that could still become a
        stop string are held back until decided. Every request ends with one `finished` delta
        (a rejected request: at once, with `output.error` set)."""
        items, params = _requests("generate_stream", prompts, sampling_params, prompt_token_ids)
        engine = self.engine
        index_of: dict[int, int] = {}
        rejected: list[StreamDelta] = []
        engine.start_streaming()
        try:
            for i, ((text, ids), p) in enumerate(zip(items, params)):
                try:
                    index_of[engine.add_request(text, ids, p)] = i
                except RequestError as err:
                    rejected.append(StreamDelta(i, -1, "", [], True, _rejected(text, ids, err)))
            engine.set_stream_indices(index_of)
            yield from rejected
            yield from engine.pop_stream_deltas()
            while engine.has_unfinished():
                engine.step()
                yield from engine.pop_stream_deltas()
        finally:
            engine.stop_streaming()


def _rejected(text, ids, err: RequestError) -> GenerationOutput:
    """The output of a request that was never queued."""
    prompt_ids = list(ids) if isinstance(ids, list) else []
    return GenerationOutput(request_id=-1, prompt=text if isinstance(text, str) else None,
                            prompt_token_ids=prompt_ids, finish_reason=FINISH_REASON_ERROR, error=str(err))


def _requests(caller: str, prompts, sampling_params, prompt_token_ids
              ) -> tuple[list[tuple[str | None, list[int] | None]], list[SamplingParams]]:
    """Normalise generate's inputs: one (text, token ids) pair and one SamplingParams per request."""
    if (prompts is None) == (prompt_token_ids is None):
        raise ValueError(f"{caller}: pass exactly one of prompts or prompt_token_ids")
    if prompts is not None:
        items: list[tuple[str | None, list[int] | None]] = [
            (p, None) for p in ([prompts] if isinstance(prompts, str) else list(prompts))]
    else:
        ids = list(prompt_token_ids)
        single = len(ids) > 0 and not isinstance(ids[0], (list, tuple))
        items = [(None, list(x)) for x in ([ids] if single else ids)]
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        params = [sampling_params or SamplingParams()] * len(items)
    else:
        params = list(sampling_params)
        if len(params) != len(items):
            raise ValueError(f"sampling_params: {len(params)} given for {len(items)} prompts")
    return items, params
