"""Any step count samples: a default ELF churn and a paper-preset entry for every NFE, an `untied-sc
calibrate` that works at unlisted NFEs (with a preset or explicit coefficients), and errors whose commands work."""

import math
import re
import shlex

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler, UntiedSelfConditioningScheduler
from untied_sc.calibration.calibrate import resolve_preset_coefficients
from untied_sc.cli import main
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.coefficients import nearest_listed_steps, paper_coefficients, preset_entry
from untied_sc.schedulers.scheduling_elf import DEFAULT_SDE_GAMMA, default_sde_gamma

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import random_statistics, tiny_tokenizer


def _sample(pipe, steps: int, seed: int = 0):
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    return pipe(batch_size=2, num_inference_steps=steps, generator=generator, output_type="seq")


# ---- the default churn ----------------------------------------------------------------------------------------------


def test_default_churn_keeps_the_official_values_and_interpolates_in_log2_between_them():
    for n, gamma in DEFAULT_SDE_GAMMA.items():
        assert default_sde_gamma(int(n)) == gamma
    assert default_sde_gamma(12) == 2.0  # between 8 (2.0) and 16 (2.0): flat
    # 24 lies between 16 (2.0) and 32 (1.5) at log2 fraction log2(24/16) = log2(1.5) ≈ 0.58496:
    # 2.0 + 0.58496·(1.5 − 2.0) = 2.0 − 0.29248 ≈ 1.70752.
    assert default_sde_gamma(24) == pytest.approx(1.70752, abs=1e-5)
    # 48 between 32 (1.5) and 64 (1.0), fraction log2(1.5) again: 1.5 − 0.29248 ≈ 1.20752.
    assert default_sde_gamma(48) == pytest.approx(1.20752, abs=1e-5)
    assert default_sde_gamma(5) == default_sde_gamma(2) == 2.0  # below 8: the value at 8
    assert default_sde_gamma(128) == default_sde_gamma(1000) == 1.0  # above 64: the value at 64
    with pytest.raises(ValueError, match="positive integer"):
        default_sde_gamma(0)


def test_explicit_churn_still_wins():
    assert ELFScheduler().sde_gamma_for(24) == default_sde_gamma(24)
    assert ELFScheduler(sde_gamma=0.5).sde_gamma_for(24) == 0.5
    table = ELFScheduler(sde_gamma_by_steps={"24": 0.7, "8": 1.0})
    assert table.sde_gamma_for(24) == 0.7 and table.sde_gamma_for(8) == 1.0
    assert table.sde_gamma_for(12) == 2.0  # not in the table: the rule


@pytest.fixture
def elf_pipe(elf_golden):
    return ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())


@pytest.mark.parametrize("steps", [12, 5])
def test_official_and_untied_elf_sample_at_unlisted_nfes(elf_pipe, steps):
    official = _sample(elf_pipe, steps)
    assert official.latents.shape[0] == 2 and torch.isfinite(official.latents).all()
    assert elf_pipe.scheduler.solver.sde_gamma == default_sde_gamma(steps) == 2.0

    statistics = random_statistics(elf_pipe.transformer, "elf", steps=(steps,))
    elf_pipe.register_modules(sampler_statistics=statistics)
    elf_pipe.scheduler = UntiedSelfConditioningScheduler.from_config(elf_pipe.scheduler.config, coefficients="elf-b")
    untied = _sample(elf_pipe, steps)
    assert torch.isfinite(untied.latents).all()
    assert not torch.equal(untied.latents, official.latents)  # the untied components acted
    assert elf_pipe.scheduler.base.solver.sde_gamma == 2.0
    nearest = {12: 16, 5: 8}[steps]
    assert elf_pipe.scheduler.coefficients._asdict() == paper_coefficients()["elf-b"][nearest]


# ---- the preset rule ------------------------------------------------------------------------------------------------


def test_presets_cover_unlisted_nfes_by_the_nearest_listed_one_in_log2():
    listed = [8, 16, 32, 64]
    # log2 boundaries at 8√2 ≈ 11.31, 16√2 ≈ 22.63, 32√2 ≈ 45.25
    expected = {2: 8, 5: 8, 11: 8, 12: 16, 22: 16, 23: 32, 24: 32, 45: 32, 46: 64, 100: 64, 1000: 64}
    assert {n: nearest_listed_steps(listed, n) for n in expected} == expected
    assert nearest_listed_steps([8, 18], 12) == 8  # log2(12/8) = log2(18/12): a tie goes to the smaller NFE
    assert math.isclose(math.log2(12 / 8), math.log2(18 / 12))
    assert preset_entry("elf-b", 16) == (16, paper_coefficients()["elf-b"][16])
    assert preset_entry("elf-b", 12) == (16, paper_coefficients()["elf-b"][16])
    assert preset_entry("langflow-owt", 100) == (128, paper_coefficients()["langflow-owt"][128])
    assert preset_entry("langflow-owt", 1000) == (256, paper_coefficients()["langflow-owt"][256])
    with pytest.raises(ValueError, match="Unknown coefficient preset"):
        preset_entry("nope", 12)


def test_calibration_and_the_scheduler_resolve_a_preset_alike():
    for name in paper_coefficients():
        family = "elf" if name.startswith("elf") else "langflow"
        steps = [3, 12, 24, 100]
        calibration = resolve_preset_coefficients(family, steps, name)
        for n in steps:
            scheduler = UntiedSelfConditioningScheduler.from_config(
                {"_class_name": "ELFScheduler" if family == "elf" else "LangFlowScheduler"}, coefficients=name
            )
            assert scheduler.resolve_coefficients(n) == calibration[n] == preset_entry(name, n)[1]
    assert resolve_preset_coefficients("elf", [12], None) == {12: paper_coefficients()["elf-b"][16]}
    # a tuned or calibrated entry for the NFE comes before the nearest preset entry
    tuned = {"eta_r": 0.1, "eta_t": 0.2, "eta_o": 0.3, "alpha": 0.4}
    scheduler = UntiedSelfConditioningScheduler.from_config(
        {"_class_name": "ELFScheduler"}, coefficients="elf-b", coefficients_by_steps={"12": tuned}
    )
    assert scheduler.resolve_coefficients(12) == tuned


# ---- the CLI at NFE 12 ----------------------------------------------------------------------------------------------


def test_cli_calibrates_at_nfe_12_and_untied_samples_there(elf_pipe, tmp_path, capsys):
    folder = tmp_path / "elf"
    elf_pipe.save_pretrained(folder)
    assert main(["calibrate", str(folder), "--nfe", "12", "--bank-size", "2", "--batch-size", "2"]) == 0
    assert "calibrated NFEs [12]" in capsys.readouterr().out
    pipe = load_pipeline(folder)
    assert pipe.sampler_statistics.config.calibrated_steps == [12]
    # the family preset (elf-b) at the nearest listed NFE, 16, went into the scheduler config
    assert pipe.scheduler.config.coefficients_by_steps == {"12": paper_coefficients()["elf-b"][16]}
    assert pipe.sampler_statistics.config.calibration_alpha == {"12": 0.8}
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    output = _sample(pipe, 12)
    assert torch.isfinite(output.latents).all()
    assert pipe.scheduler.coefficients._asdict() == paper_coefficients()["elf-b"][16]


@pytest.fixture
def langflow_folder(langflow_golden, tmp_path):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.save_pretrained(tmp_path / "langflow")
    return tmp_path / "langflow"


def test_cli_calibrate_takes_a_preset_or_all_four_explicit_coefficients(langflow_folder, capsys):
    base = ["calibrate", str(langflow_folder), "--bank-size", "2", "--batch-size", "2"]
    assert main([*base, "--nfe", "12", "--coefficients", "langflow-owt"]) == 0
    explicit = ["--eta-r", "1.1", "--eta-t", "0.9", "--eta-o", "1.0", "--alpha", "0.6"]
    assert main([*base, "--nfe", "5", "24", *explicit]) == 0
    pipe = load_pipeline(langflow_folder)
    values = {"eta_r": 1.1, "eta_t": 0.9, "eta_o": 1.0, "alpha": 0.6}
    assert pipe.scheduler.config.coefficients_by_steps == {
        "12": paper_coefficients()["langflow-owt"][16],
        "5": values,
        "24": values,
    }
    assert pipe.sampler_statistics.config.calibration_alpha == {"12": 1.0, "5": 0.6, "24": 0.6}
    capsys.readouterr()
    assert main([*base, "--nfe", "12", "--eta-r", "1.0", "--alpha", "0.5"]) == 2
    assert "all four of --eta-r --eta-t --eta-o --alpha together" in capsys.readouterr().err
    assert main([*base, "--nfe", "12", "--coefficients", "elf-b", *explicit]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*base, "--nfe", "12", *explicit[:-1], "1.5", "--overwrite"]) == 2  # α outside (0, 1]
    assert "alpha at 12 steps must lie in (0, 1]" in capsys.readouterr().err


# ---- errors name commands that work ---------------------------------------------------------------------------------


def _suggested_command(message: str, folder) -> list[str]:
    match = re.search(r"`(untied-sc calibrate PIPELINE_DIR [^`]*)`", message)
    assert match, message
    words = shlex.split(match.group(1).replace("PIPELINE_DIR", shlex.quote(str(folder))))
    assert words[0] == "untied-sc"
    return [*words[1:], "--bank-size", "2", "--batch-size", "2"]  # small banks: a test's budget


@pytest.mark.parametrize("preset", [None, "langflow-lm1b"])
def test_an_uncalibrated_nfe_names_a_command_that_then_works(langflow_folder, preset):
    assert main(["calibrate", str(langflow_folder), "--nfe", "8", "--bank-size", "2", "--batch-size", "2"]) == 0
    pipe = load_pipeline(langflow_folder)
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, coefficients=preset)
    with pytest.raises(ValueError) as error:
        _sample(pipe, 12)
    # no preset: the coefficients are missing; a preset: they resolve (nearest entry), the statistics are missing
    assert ("No coefficients for 12 steps" if preset is None else "No sampler statistics for 12 steps") in str(
        error.value
    )
    assert main(_suggested_command(str(error.value), langflow_folder)) == 0
    pipe = load_pipeline(langflow_folder)
    assert pipe.sampler_statistics.config.calibrated_steps == [8, 12]
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, coefficients=preset)
    assert torch.isfinite(_sample(pipe, 12).latents).all()


def test_missing_statistics_name_a_command_with_the_nfe(langflow_folder):
    pipe = load_pipeline(langflow_folder)
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, coefficients="langflow-owt")
    with pytest.raises(ValueError) as error:
        _sample(pipe, 12)
    assert main(_suggested_command(str(error.value), langflow_folder)) == 0
    assert load_pipeline(langflow_folder).sampler_statistics.config.calibrated_steps == [12]
