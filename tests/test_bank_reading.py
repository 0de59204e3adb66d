"""benchmarks/bank_reading.py on a run store the tuner wrote: it reads any candidate as the tuner's record does."""

import json
import shutil
from dataclasses import replace

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc.schedulers.sampler_statistics import COEFFICIENT_NAMES
from untied_sc_lab.runs import RunStore
from untied_sc_lab.tuning.tune import tune_coefficients

from .conftest import benchmark_script, langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


@pytest.fixture(scope="module")
def bank_reading():
    return benchmark_script("bank_reading")


@pytest.fixture(scope="module")
def tuned_parts(langflow_golden, tmp_path_factory):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    parts = tmp_path_factory.mktemp("bank") / "store"
    options = {"num_samples": 4, "batch_size": 2, "budget": 4, "progress": False, "store": parts}
    tune_coefficients(pipe, [8], evaluator=tiny_evaluator(), **options)
    return parts, pipe.scheduler.config.tuning_by_steps["8"]


def untied_spec(knobs: dict) -> dict:
    return {"scheduler": "untied", **{name: knobs[name] for name in COEFFICIENT_NAMES}}


def test_the_pick_reads_as_the_keep_test_recorded_it(bank_reading, tuned_parts):
    parts, record = tuned_parts
    reading = bank_reading.reading(parts, 8, untied_spec(record["best"]), {})
    expected = record["best_vs_official"]
    assert reading["ratio"] == pytest.approx(expected["ratio"], rel=1e-12)
    assert reading["ratio_ci"] == pytest.approx(expected["ratio_ci"], rel=1e-12)
    assert reading["official"]["gen_ppl"] == pytest.approx(record["official_curve"]["points"][0]["gen_ppl"])


def test_every_candidate_reads_as_its_record_point(bank_reading, tuned_parts):
    parts, record = tuned_parts
    for candidate in record["candidates"]:
        reading = bank_reading.reading(parts, 8, untied_spec(candidate), {})
        assert reading["gen_ppl"] == pytest.approx(candidate["gen_ppl"])
        assert reading["baseline_gen_ppl_at_entropy"] == pytest.approx(candidate["official_gen_ppl_at_entropy"])


def test_missing_runs_and_folders_name_what_is_there(bank_reading, tuned_parts, tmp_path, capsys):
    parts, _ = tuned_parts
    with pytest.raises(SystemExit, match=r"no run at NFE 8 with spec .*Runs of that scheduler: \{"):
        bank_reading.reading(parts, 8, {"scheduler": "untied", "eta_r": 123.0}, {})
    with pytest.raises(SystemExit, match="no scored bank runs at NFE 16"):
        bank_reading.reading(parts, 16, {"scheduler": "official"}, {})
    with pytest.raises(SystemExit, match="store.json: not found; pass a run store"):
        bank_reading.reading(tmp_path, 8, {"scheduler": "official"}, {})
    assert not (tmp_path / "store.json").exists()  # a reader makes no store
    assert bank_reading.main([str(parts), "--nfe", "8", "--spec", json.dumps({"scheduler": "official"})]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["raw_ratio"] == 1
    assert printed == json.loads(json.dumps(bank_reading.reading(parts, 8, {"scheduler": "official"}, {})))


def test_a_store_of_two_banks_is_refused_naming_them(bank_reading, tuned_parts, tmp_path):
    parts, _ = tuned_parts
    store = RunStore(shutil.copytree(parts, tmp_path / "two"))
    key, run = store.bank_runs()[0]
    store.put_bank_run(replace(key, seed=key.seed + 1), run)
    with pytest.raises(SystemExit, match=r"its runs at NFE 8 are of 2 banks .*\"seed\":"):
        bank_reading.reading(store.folder, 8, {"scheduler": "official"}, {})
