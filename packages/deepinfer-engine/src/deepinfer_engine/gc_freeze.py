"""Python's cyclic garbage collector and the decode loop.

A full collection walks every container object the process tracks: after an engine start on the
GPU that is ~250K of them (torch, TileLang and TVM modules, the model, the captured graphs), ~50-170
ms on one core, while a decode step is ~1 ms. With zero-overhead scheduling the host is one step
ahead, so a pause longer than a step idles the device for the rest of it. What the start built
lives as long as the engine, so `freeze_startup_objects` moves it out of the collector's view
(`gc.freeze`): later collections walk only the objects of the requests being served. Objects
stay freed by reference counting as before; only garbage cycles among frozen objects would stay
(the engine holds none: it is freed by reference counting alone).
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect what the start left as garbage, then freeze every object that remains; -> the
    number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
