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


def test_host_syncs_records_host_reads_with_the_line_that_made_them():
    host_syncs = benchmark_script("host_syncs")
    import torch

    x = torch.arange(4.0)
    with host_syncs.HostSyncs(device_only=False) as mode:
        value = x.sum().item()
        flag = bool((x > 1).any())
    assert value == 6.0 and flag
    assert sorted(
        (event, kind, where.split(": ", 1)[1], count) for (event, kind, _, where), count in mode.events.items()
    ) == [
        ("read", "_local_scalar_dense", "flag = bool((x > 1).any())", 1),
        ("read", "_local_scalar_dense", "value = x.sum().item()", 1),
    ]
    with host_syncs.HostSyncs(device_only=True) as mode:  # on the CPU nothing waits for a device
        x.sum().item()
    assert not mode.events
    meta = torch.empty(2, device="meta")
    assert host_syncs._devices("copy_", (meta, x), {}) == (x.device, meta.device)
    assert host_syncs._devices("_to_copy", (meta,), {"device": "cpu"}) == (meta.device, torch.device("cpu"))
    assert host_syncs._devices("_to_copy", (meta,), {"dtype": torch.float16}) is None
