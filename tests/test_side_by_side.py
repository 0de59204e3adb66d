"""benchmarks/side_by_side.py's measurement helpers: the interleaving order and the paired ratios."""

import pytest

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def side_by_side():
    return benchmark_script("side_by_side")


def test_rounds_rotate_so_every_variant_holds_every_position_equally_often(side_by_side):
    names = ("theirs", "ours_official", "ours_untied")
    orders = [side_by_side.round_order(names, r) for r in range(6)]
    assert orders[0] == list(names) and orders[1] == ["ours_official", "ours_untied", "theirs"]
    assert orders[3] == orders[0]
    for position in range(3):
        assert sorted(order[position] for order in orders) == sorted(names * 2)
    assert all(sorted(order) == sorted(names) for order in orders)  # each variant once per round


def test_ratios_are_paired_per_round_then_summarised(side_by_side):
    ours, theirs = [2.0, 3.0, 8.0], [1.0, 3.0, 2.0]
    ratios = side_by_side.paired_ratios(ours, theirs)
    assert ratios == [2.0, 1.0, 4.0]  # not median(ours) / median(theirs) = 1.0
    assert side_by_side.spread(ratios) == {"min": 1.0, "median": 2.0, "max": 4.0}
    with pytest.raises(ValueError, match="unpaired"):
        side_by_side.paired_ratios([1.0], [1.0, 2.0])
