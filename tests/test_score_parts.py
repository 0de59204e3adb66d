"""A stopped scoring resumes from its parts folder (`--score-parts-dir`) and writes the report a whole scoring writes."""

import json

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc_lab.experiments import generate_sweep, score_sweep

from .conftest import langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


@pytest.fixture(scope="module")
def evaluator():
    return tiny_evaluator()


@pytest.fixture(scope="module")
def generation(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    options = {"nfe": [8], "seeds": [0, 1], "num_samples": 4, "batch_size": 2, "progress": False, "name": "tiny"}
    return generate_sweep(pipe, command="pytest", diversity_values=[0.5], **options)


def _score(generation, evaluator, **kwargs) -> dict:
    return score_sweep(generation, evaluator=evaluator, num_resamples=20, progress=False, **kwargs)


def _without_timing(results: dict) -> dict:
    drop = ("scoring_seconds", "wall_seconds", "score_parts")
    return json.loads(json.dumps({key: value for key, value in results.items() if key not in drop}))


class Stop(Exception):
    pass


def test_a_stopped_scoring_resumes_from_its_parts_and_gives_the_whole_scorings_report(
    tmp_path, generation, evaluator, monkeypatch
):
    import untied_sc_lab.experiments.sweep as sweep_module

    whole = _score(generation, evaluator)
    runs = len(generation["runs"])
    scorer, calls = sweep_module.evaluate_samples, []

    def stopping(*args, **kwargs):  # the process is stopped while it scores its fourth run
        if len(calls) == 3:
            raise Stop
        calls.append(1)
        return scorer(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "evaluate_samples", stopping)
    with pytest.raises(Stop):
        _score(generation, evaluator, score_parts_dir=tmp_path / "parts")
    assert sorted(p.suffix for p in (tmp_path / "parts").iterdir()) == [".json"] * 3  # whole parts only

    calls.clear()
    monkeypatch.setattr(sweep_module, "evaluate_samples", lambda *a, **k: calls.append(1) or scorer(*a, **k))
    resumed = _score(generation, evaluator, score_parts_dir=tmp_path / "parts")
    assert len(calls) == runs - 3
    assert resumed["score_parts"] == {"folder": str(tmp_path / "parts"), "read": 3, "written": runs - 3}
    assert _without_timing(resumed) == _without_timing(whole)

    calls.clear()
    again = _score(generation, evaluator, score_parts_dir=tmp_path / "parts")
    assert calls == [] and again["score_parts"]["read"] == runs
    assert _without_timing(again) == _without_timing(whole)


def test_parts_of_another_scoring_are_not_read_and_a_foreign_file_is_refused(tmp_path, generation, evaluator):
    parts = tmp_path / "parts"
    first = _score(generation, evaluator, score_parts_dir=parts)
    other = _score(generation, evaluator, score_parts_dir=parts, max_length=6)  # other settings: other parts
    assert other["score_parts"]["read"] == 0 and other["score_parts"]["written"] == first["score_parts"]["written"]
    assert other["runs"] != first["runs"]

    path = next(p for p in sorted(parts.iterdir()) if json.loads(p.read_text())["identity"]["max_length"] is None)
    part = json.loads(path.read_text())
    path.write_text(json.dumps({**part, "identity": {**part["identity"], "protocol": "elf"}}))
    with pytest.raises(ValueError, match=f"{path.name} is not the scored run it is named after"):
        _score(generation, evaluator, score_parts_dir=parts)
    path.write_text("{half a file")
    with pytest.raises(ValueError, match=f"{path.name} cannot be read"):
        _score(generation, evaluator, score_parts_dir=parts)
