"""gc_freeze: the objects alive after an engine start leave the cyclic collector's view."""

import gc

from deepinfer_engine.gc_freeze import freeze_startup_objects


def test_freeze_moves_live_objects_out_of_the_collector_and_collects_first():
    class Node:
        pass

    try:
        a, b = Node(), Node()
        a.other, b.other = b, a          # a garbage cycle: collected before the freeze, not frozen
        del a, b
        survivor = [Node()]
        frozen = freeze_startup_objects()
        assert frozen == gc.get_freeze_count() > 0
        assert not any(isinstance(o, Node) for o in gc.get_objects())   # only unfrozen objects are listed
        assert survivor[0] is not None
        gc.unfreeze()
        assert sum(isinstance(o, Node) for o in gc.get_objects()) == 1  # the survivor, no cycle left
    finally:
        gc.unfreeze()
