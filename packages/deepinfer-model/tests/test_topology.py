"""Acceptance 3 (cross-layer map): every layer maps to the nearest source not later than itself."""

from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_model.topology import source_map


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 48).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), max_size=n))))
def test_source_map_rule(args):
    n, ids = args
    lmap = source_map(sorted(ids), n)
    assert len(lmap) == n
    for layer in range(n):
        earlier = [s for s in ids if s <= layer]
        if not earlier:
            assert lmap[layer] == layer                     # before the first source: itself
        else:
            assert lmap[layer] == max(earlier)              # nearest source not later than itself
            assert lmap[lmap[layer]] == lmap[layer]         # a source maps to itself
    for s in ids:
        assert lmap[s] == s
