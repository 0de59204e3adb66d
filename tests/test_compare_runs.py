"""benchmarks/compare_runs.py on hand-made run logs: which steps it compares and the gaps it reports."""

import json
from pathlib import Path

import pytest

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def compare_runs():
    return benchmark_script("compare_runs")


def write_log(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir()
    (folder / "loss_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_validation_gaps_at_the_shared_steps_and_training_tail(tmp_path, compare_runs):
    reference = [{"step": s, "loss": 4.0} for s in range(10, 70, 10)]
    reference += [{"step": s, "val_loss": 2.0 + s / 100} for s in (20, 40, 60)]
    retrain = [{"step": s, "loss": 4.4 if s == 80 else 4.0} for s in range(10, 90, 10)]
    retrain += [{"step": s, "val_loss": (2.0 + s / 100) * 1.01} for s in (20, 40, 80)]
    val = compare_runs.compare_validation(reference, retrain)
    assert val["shared_steps"] == 2 and val["last_shared_step"] == 40 and val["final_steps"] == [60, 80]
    assert val["at_last_shared_step"]["val_loss"]["relative_gap"] == pytest.approx(0.01)
    assert val["at_final_steps"]["val_loss"] == {"reference": 2.6, "retrain": pytest.approx(2.8 * 1.01)}
    training = compare_runs.compare_training(reference, retrain, ("loss",), window=2)
    assert training["loss"]["reference"] == 4.0 and training["loss"]["retrain"] == pytest.approx(4.2)
    assert training["loss"]["relative_gap"] == pytest.approx(0.05)
    markdown = compare_runs.format_markdown(
        {"name": "tiny", "reference": "a", "retrain": "b", "window": 2, "validation": val, "training": training}
        | {"wall_seconds": 0.1, "command": "python benchmarks/compare_runs.py a b"}
    )
    assert "| val_loss | 2.4000 | 2.4240 | +1.00% |" in markdown and "| loss | 4.0000 | 4.2000 | +5.00% |" in markdown


def test_runs_without_a_shared_evaluation_step_are_refused(compare_runs):
    with pytest.raises(ValueError, match="no validation metrics at a common step"):
        compare_runs.compare_validation([{"step": 10, "val_loss": 1.0}], [{"step": 20, "val_loss": 1.0}])
