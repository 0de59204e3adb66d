"""Seed spaces: calibration, tuning, ACE and benchmark batches are disjoint by construction; records that name no
space (the bundled folders') read as the benchmark's, and their seeds are refused."""

import json
import shutil

import numpy as np
import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler
from untied_sc.calibration.ace import ACEStatistics
from untied_sc.calibration.calibrate import bank_seeds, base_scale_seeds
from untied_sc.cli import main as cli_main
from untied_sc.generation import refuse_leaked_seeds
from untied_sc.generation.sampling import batch_seed, tuning_seeds
from untied_sc.pipelines import load_pipeline
from untied_sc.seeds import (
    BATCH_STRIDE,
    MAX_SEED,
    MAX_STREAM,
    SPACE_OFFSETS,
    SPACE_WIDTH,
    calibration_seeds,
    check_seed,
    generator_seed,
    seeds_in_space,
    streams_of_record,
)
from untied_sc_lab.experiments.sweep import generate_sweep
from untied_sc_lab.experiments.sweep_settings import SweepSettings

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import tiny_tokenizer


@pytest.fixture
def langflow_pipe(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_benchmark_batches_keep_their_seeds():
    assert batch_seed(0, 0) == 0 and batch_seed(3, 5) == 1_000_003 * 3 + 5  # the committed results' seeding
    assert generator_seed("benchmark", 7, 2) == batch_seed(7, 2)


def test_every_space_is_a_disjoint_interval_whatever_the_seeds():
    largest = BATCH_STRIDE * (MAX_STREAM - 1) + BATCH_STRIDE - 1
    assert largest < SPACE_WIDTH  # the highest batch of a space stays below the next space's first
    offsets = sorted(SPACE_OFFSETS.values())
    assert offsets[0] == 0 and all(b - a == SPACE_WIDTH for a, b in zip(offsets[:-1], offsets[1:], strict=True))
    assert offsets[-1] + SPACE_WIDTH <= 2**64  # every generator seed is a valid torch seed
    for space in SPACE_OFFSETS:
        low, high = generator_seed(space, 0, 0), generator_seed(space, MAX_STREAM - 1, BATCH_STRIDE - 1)
        assert high - low == largest
        torch.Generator().manual_seed(high)
        others = [generator_seed(o, s, b) for o in SPACE_OFFSETS if o != space for s, b in ((0, 0), (1, 3))]
        assert not any(low <= g <= high for g in others)


def test_out_of_range_streams_batches_and_spaces_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 2\*\*36\)"):
        generator_seed("tuning", MAX_STREAM, 0)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*36\)"):
        generator_seed("benchmark", -1, 0)
    with pytest.raises(ValueError, match="batch index"):
        generator_seed("benchmark", 0, BATCH_STRIDE)
    with pytest.raises(ValueError, match="Unknown seed space 'tune'"):
        generator_seed("tune", 0, 0)


def test_check_seed_accepts_integers_in_range_and_names_the_option():
    assert check_seed(np.int64(5)) == 5 and check_seed(MAX_SEED - 1) == MAX_SEED - 1
    for bad in (-1, MAX_SEED):
        with pytest.raises(ValueError, match=r"--seeds must lie in \[0, 2\*\*32\)"):
            check_seed(bad, "--seeds")
    for bad in (1.0, True, "3"):
        with pytest.raises(ValueError, match="must be an integer"):
            check_seed(bad)


def test_calibration_and_base_scale_banks_never_draw_a_benchmark_batch():
    bank_mu, bank_sigma = bank_seeds(0, 0, 8, 4), bank_seeds(0, 1, 8, 4)
    assert [g for g, _ in bank_mu] == [generator_seed("calibration", 0, b) for b in (0, 1)]
    assert [g for g, _ in bank_sigma] == [generator_seed("calibration", 1, b) for b in (0, 1)]
    assert [g for g, _ in base_scale_seeds(0, 8, 4)] == [generator_seed("base_scales", 0, b) for b in (0, 1)]
    benchmark_top = generator_seed("benchmark", MAX_STREAM - 1, BATCH_STRIDE - 1)
    assert all(g > benchmark_top for g, _ in bank_mu + bank_sigma + base_scale_seeds(0, 8, 4))


def test_records_name_their_space_and_old_lists_read_as_benchmark_seeds():
    assert streams_of_record([4000, 4001]) == ("benchmark", [4000, 4001])
    assert streams_of_record({"space": "calibration", "streams": [0, 1]}) == ("calibration", [0, 1])
    records = [[4000, 4001], {"space": "calibration", "streams": [0, 1]}]
    assert seeds_in_space(records, "benchmark") == {4000, 4001}
    assert seeds_in_space(records, "calibration") == {0, 1}


def test_the_readme_calibration_seed_0_leaves_the_default_benchmark_seeds_usable(langflow_pipe):
    """Regression: `pipe.calibrate(..., seed=0)` made the default benchmark (seeds 0, 1, 2) refuse."""
    langflow_pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, seed=0, progress=False)
    statistics = langflow_pipe.sampler_statistics
    assert statistics.config.seeds == {"8": {"space": "calibration", "streams": [0, 1]}}
    assert calibration_seeds(statistics) == set()
    refuse_leaked_seeds([0, 1, 2], langflow_pipe)  # nothing leaks
    generation = generate_sweep(
        langflow_pipe, SweepSettings([8], [0, 1, 2], num_samples=2, batch_size=2), progress=False
    )
    assert len(generation.runs) == 6  # official and untied at 3 seeds


def _with_config(component, **changes):
    component.register_to_config(**changes)
    return component


def test_records_written_before_the_seed_spaces_are_still_refused(langflow_pipe):
    langflow_pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    statistics = langflow_pipe.sampler_statistics
    _with_config(statistics, seeds={"8": [0, 1]})  # an old calibration with seed 0: benchmark seeds 0 and 1
    with pytest.raises(ValueError, match=r"Seeds \[1\] drew the trajectory banks .* calibrated on"):
        refuse_leaked_seeds([1, 2], langflow_pipe)
    _with_config(statistics, seeds={"8": {"space": "calibration", "streams": [0, 1]}})
    refuse_leaked_seeds([1, 2], langflow_pipe)

    scheduler = langflow_pipe.scheduler
    old = {"seed": 2, "num_samples": 4}
    _with_config(scheduler, tuning_by_steps={"8": old})  # an old tuning record: a benchmark seed
    assert tuning_seeds(langflow_pipe) == {2}
    with pytest.raises(ValueError, match=r"Seeds \[2\] are the bank .* tuned on .* Choose other --seed\."):
        refuse_leaked_seeds([1, 2], langflow_pipe, option="--seed")
    _with_config(scheduler, tuning_by_steps={"8": {**old, "seed_space": "tuning"}})
    assert tuning_seeds(langflow_pipe) == set()
    refuse_leaked_seeds([1, 2], langflow_pipe)

    ace = ACEStatistics(solver="langflow", latent_dim=4, num_trajectories=4, batch_size=2, seed=1)  # old: no space
    langflow_pipe.register_modules(ace_statistics=ace)
    assert ace.benchmark_seeds == {1} and ace.batch_seeds == {batch_seed(1, 0), batch_seed(1, 1)}
    with pytest.raises(ValueError, match=r"Seeds \[1\] drew the trajectories ACE's direction was estimated on"):
        refuse_leaked_seeds([1, 2], langflow_pipe)
    ace.register_to_config(seed_space="ace")
    assert ace.benchmark_seeds == set() and min(ace.batch_seeds) >= SPACE_OFFSETS["ace"]
    refuse_leaked_seeds([1, 2], langflow_pipe)


def test_bundled_folders_keep_their_old_records_and_refuse_those_seeds():
    pipe = load_pipeline("hub_artifacts/langflow-small")
    assert calibration_seeds(pipe.sampler_statistics) == {4000, 4001}
    assert tuning_seeds(pipe) == {10_000}
    with pytest.raises(ValueError, match=r"Seeds \[4000\]"):
        refuse_leaked_seeds([0, 4000], pipe)


def test_recalibrating_one_nfe_keeps_the_other_nfes_tensors_and_the_base_scales_they_were_measured_with(elf_golden):
    pipe = ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    options = {"bank_size": 4, "batch_size": 2, "base_scale_bank_size": 2, "progress": False}
    pipe.calibrate(nfe=[8], **options)
    before = {k: v.clone() for k, v in pipe.sampler_statistics.state_dict().items()}
    _with_config(pipe.sampler_statistics, seeds={"8": [4000, 4001]})  # as a folder calibrated before the spaces
    pipe.calibrate(nfe=[16], seed=5, **options)  # another seed would measure other base scales
    after = pipe.sampler_statistics
    for name, tensor in before.items():
        assert torch.equal(after.state_dict()[name], tensor), name  # basis, ρ², base scales and NFE 8 exactly
    assert after.config.seeds == {"8": [4000, 4001], "16": {"space": "calibration", "streams": [10, 11]}}
    assert calibration_seeds(after) == {4000, 4001}

    pipe.calibrate(nfe=[8, 16], seed=5, **options)  # nothing is kept: the base scales are measured anew
    assert not torch.equal(pipe.sampler_statistics.base_scales, before["base_scales"])


def test_cli_refuses_a_seed_out_of_range_before_sampling(tmp_path, langflow_pipe, capsys):
    langflow_pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    langflow_pipe.save_pretrained(tmp_path / "pipe")
    out = tmp_path / "samples.jsonl"
    assert cli_main(["generate", str(tmp_path / "pipe"), "--nfe", "8", "--num-samples", "2", "--seed", "-1",
                     "--out", str(out), "--no-progress"]) == 2  # fmt: skip
    assert "--seed must lie in [0, 2**32)" in capsys.readouterr().err and not out.exists()


def test_old_folder_records_survive_a_copy_and_reload(tmp_path, langflow_pipe):
    """A folder whose statistics config holds an old list entry loads and keeps refusing it."""
    langflow_pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    langflow_pipe.save_pretrained(tmp_path / "new")
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    config_path = tmp_path / "old" / "sampler_statistics" / "config.json"
    config = json.loads(config_path.read_text())
    config["seeds"] = {"8": [4000, 4001]}
    config_path.write_text(json.dumps(config))
    assert calibration_seeds(load_pipeline(tmp_path / "new").sampler_statistics) == set()
    assert calibration_seeds(load_pipeline(tmp_path / "old").sampler_statistics) == {4000, 4001}
