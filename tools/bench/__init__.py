"""tools/benchmark.py's parts: the engine and prompts (engine), prefill rows (prefill), the HF peer
(peer_hf), the hardware ceilings of the run (ceilings) and the result rows of docs/results (rows).
Import with `tools/` on sys.path (tools/benchmark.py does that)."""
