"""The link between `deepinfer serve --api-workers N`'s API worker processes and its engine process.

    engine process                                   API worker process (x N, uvicorn workers)
    AsyncLLM loop + ServingMetrics                   FastAPI app: HTTP, JSON, SSE
    WorkerHub (serving.worker_hub) --- unix socket --- EngineClient (serving.api_worker)

One `multiprocessing.connection` per worker (pickled tuples, an authkey). The first message is
the engine's `ServerInfo`; after that:

    worker -> engine   (ADD, local id, prompt ids, SamplingParams, arrival)    arrival: time.monotonic()
                       (ABORT, local id)
                       (SCRAPE, call id)                                     -> (SCRAPED, call id, text)
                       (HTTP_ERROR, status)                                  counted in the engine's metrics
    engine -> worker   (DELTAS, [(local id, packed RequestDelta), ...])      one message per loop iteration
                       (HEALTH, ok, reason)                                  every HEARTBEAT_S

Local ids are the worker's; the engine never sees a worker's sockets and a worker never touches
the engine. A worker that goes away aborts all of its requests in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_engine.serving.async_llm import RequestDelta

ADDRESS_ENV = "DEEPINFER_ENGINE_LINK"          # the engine's unix socket path
AUTHKEY_ENV = "DEEPINFER_ENGINE_LINK_KEY"      # hex of the link's authkey
HEARTBEAT_S = 0.5
HEARTBEAT_STALE_S = 10.0                       # a worker's /health fails after this long without one

ADD, ABORT, SCRAPE, HTTP_ERROR = "add", "abort", "scrape", "http_error"
DELTAS, HEALTH, SCRAPED = "deltas", "health", "scraped"


@dataclass(frozen=True)
class ServerInfo:
    """What a worker needs to parse, encode and format requests (sent once, at connect)."""

    model_name: str
    chat_template: str
    tokenizer: object | None        # deepinfer_engine.tokenizer.TextTokenizer (picklable), None: ids only
    vocab_size: int
    max_model_len: int
    default_max_tokens: int


def pack(d: RequestDelta) -> tuple:
    """A delta as a plain tuple (pickles several times faster than the dataclass)."""
    return (d.text, d.token_ids, d.logprobs, d.top_logprobs, d.finished, d.finish_reason, d.error,
            d.num_prompt_tokens, d.num_cached_tokens, d.num_output_tokens)


def unpack(t: tuple) -> RequestDelta:
    return RequestDelta(*t)
