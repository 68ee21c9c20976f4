"""deepinfer_engine: `LLM` / `SamplingParams`, the engine loop, model runner, sampler and CLI."""

from deepinfer_engine.errors import InvalidRequestError, ModelDoesNotFitError
from deepinfer_engine.llm import LLM
from deepinfer_engine.outputs import GenerationOutput
from deepinfer_engine.sampling_params import SamplingParams

__version__ = "0.1.6"
__all__ = ["LLM", "GenerationOutput", "InvalidRequestError", "ModelDoesNotFitError", "SamplingParams", "__version__"]
