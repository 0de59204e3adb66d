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


def test_a_checkout_carried_without_git_is_named_by_its_stamp(side_by_side, tmp_path):
    import subprocess

    checkout = tmp_path / "repo"
    checkout.mkdir()
    run = {"cwd": checkout, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    (checkout / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "add", "a.py"], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"], **run)
    state = side_by_side.git_state(checkout)
    assert len(state["commit"]) == 40 and state["tracked_files_modified"] is False
    (checkout / "a.py").write_text("x = 2\n")
    assert side_by_side.git_state(checkout)["tracked_files_modified"] is True

    copy = tmp_path / "carried"  # what a device call receives: the files, no .git
    copy.mkdir()
    (copy / "a.py").write_text("x = 1\n")
    assert side_by_side.git_state(copy) == {
        "path": str(copy),
        "commit": None,
        "branch": None,
        "tracked_files_modified": None,
    }
    (copy / "COMMIT").write_text(state["commit"] + "\n")
    carried = side_by_side.git_state(copy)
    assert carried["commit"] == state["commit"] and carried["tracked_files_modified"] is None
