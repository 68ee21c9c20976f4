"""Engine configuration: what the user sets on `LLM(...)`, validated once, then resolved once.

`EngineConfig` holds the user's settings; a field left `None` defers to its DEEPINFER_* knob
(envs.py). `EngineConfig.resolve(envs, device_type)` decides every such field in one place and
returns a frozen `ResolvedEngineConfig`: the engine reads only that, never the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from deepinfer_engine.envs import Envs

# Prefill chunk budget on CUDA: `mini` 64 x 512 prefill on the H200 (2026-11-30, one run) gave
# 136K / 191K / 214K tokens/s at 8K / 16K / 32K rows per step (host launch costs amortise over
# more rows); 16K takes most of the gain while a prefill step still stalls decode for ~85 ms only.
DEFAULT_BATCHED_TOKENS_CUDA = 16384
DEFAULT_BATCHED_TOKENS_CPU = 2048
# The window KV layout per device when EngineConfig.window_kv is None: the rings are tested bit for
# bit against the paged layout on the CPU; CUDA keeps the paged layout until the GPU suite
# (test_gpu_engine.py, test_swa_tier.py on CUDA) has run the rings.
WINDOW_KV_DEFAULT = {"cpu": "ring", "cuda": "paged"}


@dataclass
class EngineConfig:
    model: str | Path | None = None        # HF-layout checkpoint dir; None = the embedded default model
    device: str | None = None              # "cpu", "cuda", "cuda:1"; None = CUDA if present else CPU
    dtype: str | None = None               # "bfloat16" | "float32"; None = bf16 on CUDA, fp32 on the CPU
    max_num_seqs: int = 64                 # concurrent sequences per step
    max_model_len: int | None = None       # prompt + output limit; None = the model's max_position_embeddings
    max_num_batched_tokens: int | None = None  # rows per step (prefill chunk budget, decode rows); None =
                                           #   DEFAULT_BATCHED_TOKENS_CUDA / _CPU (above)
    block_size: int = 128                  # tokens per KV block = prefix-cache grain (SPEC §3)
    num_kv_blocks: int | None = None       # KV pool size; None = sized from the memory budget
    kv_cache_memory_bytes: int | None = None  # CPU budget for the KV pool (None = 1 GiB or what fits)
    gpu_memory_utilization: float = 0.90   # fraction of GPU memory for weights + activations + KV
    enable_prefix_caching: bool = True
    window_kv: str | None = None           # "ring": window KV and compressor stage as per-request rings of
                                           #   W + nextn + 1 rows (SPEC's layout); "paged": every position
                                           #   kept in the blocks; None = the device's default
                                           #   (WINDOW_KV_DEFAULT: rings on the CPU; on CUDA the paged
                                           #   layout until the GPU suite has run the rings)
    swa_snapshot_tokens: int = 128         # rings: the SWA tier's grain A (SPEC §5: 128-aligned snapshots)
    swa_host_cache_bytes: int = 1 << 30    # rings: host memory for SWA snapshots (LRU; pinned on CUDA)
    num_speculative_tokens: int | None = None  # DSpark drafts per step; None = DEEPINFER_USE_NEXTN_DECODE
                                           #   (default 5), clipped to the model's nextn; 0 = off
    enable_mtp_varlen: bool | None = None  # confidence-scheduled draft lengths; None = DEEPINFER_ENABLE_MTP_VARLEN
    zero_overhead_scheduling: bool | None = None  # CPU one step ahead of the device; None = env (default on)
    cuda_graphs: bool = True               # replay decode steps as CUDA graphs (CUDA only)
    compile_decode: bool | None = None     # torch.compile the graphed decode step; None = DEEPINFER_COMPILE_DECODE
    decode_streams: bool | None = None     # decode steps run independent kernel chains on side CUDA streams;
                                           #   None = DEEPINFER_DECODE_STREAMS (default on)
    compile_speculation: bool | None = None  # torch.compile the step's speculative part (CUDA graphs);
                                           #   None = DEEPINFER_COMPILE_SPECULATION
    seed: int = 0                          # engine seed: draws per-request seeds when none is given
    random_init_seed: int = 0              # weights seed when no checkpoint exists (tiny preset)
    # Structured output (issue 9): grammar compilation off the engine loop.
    structured_output_compile_timeout_s: float = 30.0   # a grammar compiling longer fails its request
    structured_output_cache_bytes: int = 256 << 20      # compiled-grammar LRU cache bound (bytes)
    structured_output_compile_threads: int = 2          # compile worker threads

    def batched_tokens_for(self, device_type: str) -> int:
        """max_num_batched_tokens, or its default for the device."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return DEFAULT_BATCHED_TOKENS_CUDA if device_type == "cuda" else DEFAULT_BATCHED_TOKENS_CPU

    def resolve(self, envs: Envs, device_type: str) -> ResolvedEngineConfig:
        """Every knob decided (validates first): a field set here wins over its environment knob,
        `None` takes the knob; the prefill budget takes the device's default. Batch invariance fixes
        the draft lengths: the confidence-scheduled budget splits drafts across the batch, and a
        sampled request's tokens depend on which drafts it verified (residual sampling)."""
        self.validate()

        def pick(value, knob):
            return knob if value is None else value

        given = {f.name: getattr(self, f.name) for f in fields(self)}
        given.update(
            max_num_batched_tokens=self.batched_tokens_for(device_type),
            window_kv=self.window_kv or WINDOW_KV_DEFAULT.get(device_type, "ring"),
            num_speculative_tokens=pick(self.num_speculative_tokens, envs.use_nextn_decode),
            enable_mtp_varlen=pick(self.enable_mtp_varlen, envs.enable_mtp_varlen) and not envs.batch_invariant,
            zero_overhead_scheduling=pick(self.zero_overhead_scheduling, envs.zero_overhead_scheduling),
            compile_decode=pick(self.compile_decode, envs.compile_decode),
            decode_streams=pick(self.decode_streams, envs.decode_streams),
            compile_speculation=pick(self.compile_speculation, envs.compile_speculation),
        )
        return ResolvedEngineConfig(**given, batch_invariant=envs.batch_invariant,
                                    cudagraph_batch_size_interval=envs.cudagraph_batch_size_interval, envs=envs)

    def validate(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if name == "max_num_batched_tokens" and value is None:
                continue
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len: must be positive, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks: must be positive, got {self.num_kv_blocks}")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens: must be >= 0, got {self.num_speculative_tokens}")
        if not self.structured_output_compile_timeout_s > 0:
            raise ValueError("structured_output_compile_timeout_s: must be > 0, got "
                             f"{self.structured_output_compile_timeout_s}")
        if self.structured_output_cache_bytes < 0 or self.structured_output_compile_threads < 1:
            raise ValueError("structured_output_cache_bytes must be >= 0 and structured_output_compile_threads >= 1")
        if self.window_kv not in (None, "ring", "paged"):
            raise ValueError(f"window_kv: must be 'ring' or 'paged', got {self.window_kv!r}")
        if self.swa_snapshot_tokens <= 0 or self.swa_host_cache_bytes < 0:
            raise ValueError("swa_snapshot_tokens must be > 0 and swa_host_cache_bytes >= 0")
        if not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True)
class ResolvedEngineConfig:
    """`EngineConfig` with every environment-backed knob decided (`EngineConfig.resolve`). Limits
    that depend on the loaded model (max_model_len, the drafts the model's head allows) are the
    engine's, applied on top of these."""

    model: str | Path | None               # as EngineConfig
    device: str | None                     # as EngineConfig (the loader turns it into a torch.device)
    dtype: str | None                      # as EngineConfig
    max_num_seqs: int                      # concurrent sequences per step
    max_model_len: int | None              # None = the model's max_position_embeddings
    max_num_batched_tokens: int            # rows per step, the device's default applied
    block_size: int                        # tokens per KV block
    num_kv_blocks: int | None              # None = sized from the memory budget
    kv_cache_memory_bytes: int | None      # CPU budget for the KV pool
    gpu_memory_utilization: float          # fraction of GPU memory for weights + activations + KV
    enable_prefix_caching: bool
    window_kv: str                         # "ring" | "paged" (as EngineConfig)
    swa_snapshot_tokens: int               # SWA tier grain (rounded up to the block size and ratios)
    swa_host_cache_bytes: int              # host memory for SWA snapshots
    num_speculative_tokens: int            # drafts per step asked for (the engine clips to the model's nextn)
    enable_mtp_varlen: bool                # confidence-scheduled draft lengths (False under batch invariance)
    zero_overhead_scheduling: bool         # CPU one step ahead of the device
    cuda_graphs: bool                      # replay decode steps as CUDA graphs (CUDA only)
    compile_decode: bool                   # torch.compile the graphed decode step
    decode_streams: bool                   # side CUDA streams for a decode step's independent chains
    compile_speculation: bool              # torch.compile the speculative part (not with batch invariance)
    seed: int                              # engine seed: draws per-request seeds
    random_init_seed: int                  # weights seed when no checkpoint exists
    structured_output_compile_timeout_s: float
    structured_output_cache_bytes: int
    structured_output_compile_threads: int
    batch_invariant: bool                  # DEEPINFER_BATCH_INVARIANT: results independent of the batch
    cudagraph_batch_size_interval: int     # DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL: graph bucket spacing
    envs: Envs                             # every knob as read (the kernels' too), for logs and checks
