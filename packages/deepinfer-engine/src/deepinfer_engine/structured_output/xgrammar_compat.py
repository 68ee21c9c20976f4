"""Import xgrammar without transformers.

xgrammar (0.2.8, 0.2.9) imports `transformers` at module level for its HF helpers
(`TokenizerInfo.from_huggingface`, `contrib.hf.LogitsProcessor`), none of which we use: the engine
builds `TokenizerInfo` from its own byte table. When transformers is not installed, a throwaway
stub with the three names xgrammar touches stands in during the import and is removed right after,
so nothing else in the process ever sees a fake `transformers`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

_STUB_NAMES = ("PreTrainedTokenizerBase", "PreTrainedTokenizerFast", "LogitsProcessor")
_xgr = None


def import_xgrammar():
    global _xgr
    if _xgr is not None:
        return _xgr
    if "xgrammar" in sys.modules:
        _xgr = sys.modules["xgrammar"]
        return _xgr
    if importlib.util.find_spec("xgrammar") is None:
        raise ImportError("structured output needs xgrammar (pip install --no-deps xgrammar apache-tvm-ffi; "
                          "pip install pydantic): see tools/setup_env.sh")
    stubbed = False
    if "transformers" not in sys.modules and importlib.util.find_spec("transformers") is None:
        stub = types.ModuleType("transformers")
        stub.__doc__ = "deepinfer: import-time stand-in for xgrammar (transformers is not installed)"
        for name in _STUB_NAMES:
            setattr(stub, name, type(name, (), {}))
        sys.modules["transformers"] = stub
        stubbed = True
    try:
        _xgr = importlib.import_module("xgrammar")
    finally:
        if stubbed:
            sys.modules.pop("transformers", None)
    return _xgr
