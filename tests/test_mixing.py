"""Shuffle-quality metrics on constructed orders."""

from __future__ import annotations

import numpy as np
import pytest

from audit import mixing

pytestmark = pytest.mark.fast  # the unit lane: make test-fast

LABELS = np.repeat(np.arange(10), 500)  # 5,000 examples, 10 labels, sorted


def test_random_permutation_scores_about_one():
    rng = np.random.default_rng(7)
    ratio = mixing.label_mix_ratio(rng.permutation(LABELS), batch_size=64)
    assert 0.9 < ratio < 1.1


def test_sorted_order_scores_far_above_one():
    assert mixing.label_mix_ratio(LABELS, batch_size=64) > 5


def test_round_robin_stratified_order_scores_below_one():
    round_robin = np.tile(np.arange(10), 500)
    assert mixing.label_mix_ratio(round_robin, batch_size=64) < 0.5


def test_order_memory():
    rng = np.random.default_rng(1)
    assert mixing.order_memory(np.arange(1000)) > 0.999
    assert abs(mixing.order_memory(rng.permutation(1000))) < 0.1


def test_neighbour_repeats():
    rng = np.random.default_rng(2)
    order = list(range(2000))
    assert mixing.neighbour_repeats(order, order) == 1.0
    assert mixing.neighbour_repeats(order, order[::-1]) == 1.0  # pairs are unordered
    trials = [
        mixing.neighbour_repeats(rng.permutation(2000), rng.permutation(2000)) for _ in range(20)
    ]
    assert np.mean(trials) < 3 * mixing.independent_neighbour_repeats(2000)
