"""Online serving: `AsyncLLM` (one background loop owns the engine) and the OpenAI-compatible
HTTP server (`deepinfer serve`). The HTTP parts (FastAPI, uvicorn, prometheus_client) are
imported only by the modules that need them, so `deepinfer_engine` imports without them."""

from deepinfer_engine.serving.async_llm import AsyncLLM, RequestDelta, RequestStream

__all__ = ["AsyncLLM", "RequestDelta", "RequestStream"]
