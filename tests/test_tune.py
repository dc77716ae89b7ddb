"""The auto-tuner: two loads when the prediction is right, never much more than a bisection."""

from __future__ import annotations

import math

import pytest

from moeplace.tune import search


def threshold(t: int, speeds: dict[int, float] | None = None):
    return lambda n: ("ok", (speeds or {}).get(n, 10.0)) if n >= t else ("oom", None)


@pytest.mark.parametrize("n_layer", [8, 27, 48])
def test_search_finds_the_cliff_from_any_prediction(n_layer):
    worst = 0
    for predicted in range(n_layer + 1):
        for t in range(n_layer + 2):  # t = n_layer + 1: nothing fits
            r = search(predicted, n_layer, threshold(t))
            assert r.lowest_n == (t if t <= n_layer else None)
            if t == predicted and t > 0:
                assert r.loads == 2  # n* runs, n*-1 does not
            worst = max(worst, r.loads)
    assert worst <= math.ceil(math.log2(n_layer + 1)) + 2


def test_margin_adds_whole_layers():
    r = search(4, 8, threshold(4), margin=2)
    assert (r.lowest_n, r.chosen_n, r.loads) == (4, 6, 3)


def test_a_collapse_next_to_a_feasible_neighbour_is_a_silent_spill():
    # n = 3 'runs' but at a fifth of n = 4's speed: memory spilled, so 4 is the answer.
    r = search(4, 8, threshold(0, {3: 2.0, 4: 10.0}))
    assert r.lowest_n == 4
