"""Bad inputs get a clear error or warning that names the file, the field and the fix; refusals that need no model
come before torch loads; ELF conversion never guesses the sequence length; the ELF network runs without its
self-conditioning input on request."""

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from untied_sc import ELFPipeline, LangFlowPipeline, load_official_elf
from untied_sc.cli import main
from untied_sc.input_checks import resolve_protocol
from untied_sc.schedulers import ELFScheduler, LangFlowScheduler, UntiedELFScheduler, UntiedLangFlowScheduler
from untied_sc.schedulers.coefficients import paper_coefficients

from .conftest import elf_from_golden, langflow_from_golden
from .test_models import _write_official_elf_checkpoint
from .tiny import random_statistics, tiny_tokenizer, tiny_tokenizer_folder


SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, elf_golden, langflow_golden):
    """An ELF pipeline with model card files, and a calibrated LangFlow pipeline, saved as folders."""
    root = tmp_path_factory.mktemp("inputs")
    elf = ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())
    elf.save_pretrained(root / "elf")
    for name in ("README.md", "training_info.json", "latent_normalization.json"):
        (root / "elf" / name).write_text("{}")
    model = langflow_from_golden(langflow_golden)
    langflow = LangFlowPipeline(model, LangFlowScheduler(), tiny_tokenizer(), random_statistics(model, "langflow"))
    langflow.save_pretrained(root / "langflow")
    return root


def _copy(folders: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folders / name, tmp_path / name))


def _edit_index(folder: Path, **changes) -> None:
    path = folder / "model_index.json"
    index = json.loads(path.read_text())
    index.update(changes)
    path.write_text(json.dumps({k: v for k, v in index.items() if v is not None}))


# --- evaluate: the protocol ----------------------------------------------------------------------------------------


def test_evaluate_takes_the_protocol_a_benchmark_samples_file_records(tmp_path, capsys):
    samples = tmp_path / "langflow-small.samples.jsonl.gz"
    shutil.copy(Path(__file__).parents[1] / "benchmarks/results/langflow-small-baselines.samples.jsonl.gz", samples)
    (tmp_path / "langflow-small.json").write_text(json.dumps({"family": "langflow", "protocol": "langflow"}))
    assert resolve_protocol(samples, None) == ("langflow", None)
    # the output name shows the protocol chosen; an existing one is refused before any scoring
    (tmp_path / "langflow-small.samples.jsonl.gz.eval-langflow.json").write_text("{}")
    assert main(["evaluate", str(samples)]) == 2
    assert "eval-langflow.json exists; pass --overwrite" in capsys.readouterr().err
    # a --protocol that contradicts the record is honoured, with a warning naming the record
    protocol, warning = resolve_protocol(samples, "elf")
    assert protocol == "elf" and "langflow-small.json records protocol 'langflow'" in warning


def test_evaluate_refuses_to_guess_the_protocol_of_a_bare_jsonl(tmp_path, capsys):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"text": "w3 w4"}) + "\n")
    assert main(["evaluate", str(samples)]) == 2
    error = capsys.readouterr().err
    assert f"{samples} does not record which model produced it" in error
    assert "pass --protocol {elf,langflow}" in error


def test_evaluate_says_a_jsonl_samples_file_is_expected(tmp_path, folders, capsys):
    assert main(["evaluate", str(folders / "elf" / "model_index.json"), "--protocol", "elf"]) == 2
    error = capsys.readouterr().err
    assert "model_index.json is a pipeline or model config, not a samples file" in error
    assert "a JSONL samples file holds one JSON object per line" in error and "untied-sc generate" in error
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["evaluate", str(empty), "--protocol", "elf"]) == 2
    assert f"{empty} is empty: it holds no samples to score" in capsys.readouterr().err


# --- refusals before torch ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "{pipe}", "--nfe", "8", "--out", "{taken}"], "exists; pass --overwrite"),
        (["benchmark", "{pipe}", "--name", "taken", "--output-dir", "{tmp}"], "already exist"),
        (["benchmark", "--rescore", "{tmp}/no-such.json", "--evaluator", "gemma3-270m"], "no such file"),
        (["evaluate", "{empty}", "--protocol", "elf"], "is empty"),
        (["calibrate", "{tmp}/no-such-folder", "--nfe", "8"], "does not exist"),
    ],
)
def test_refusals_that_need_no_model_do_not_import_torch(tmp_path, argv, message):
    (tmp_path / "pipe").mkdir()
    (tmp_path / "taken").write_text("x")
    (tmp_path / "taken.json").write_text("{}")
    (tmp_path / "empty.jsonl").write_text("")
    argv = [
        a.format(pipe=tmp_path / "pipe", taken=tmp_path / "taken", tmp=tmp_path, empty=tmp_path / "empty.jsonl")
        for a in argv
    ]
    code = (
        "import sys; from untied_sc.cli import main; status = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported'); sys.exit(status)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert run.stdout.strip() == "torch not imported"


def test_calibrate_and_tune_say_a_mistyped_path_does_not_exist(tmp_path, capsys):
    for command in ("calibrate", "tune"):
        assert main([command, str(tmp_path / "pipelne"), "--nfe", "8"]) == 2
        error = capsys.readouterr().err
        assert f"'{tmp_path / 'pipelne'}' does not exist: give the path of a local pipeline folder" in error
        assert "Hub" not in error
    assert main(["calibrate", "someone/pipeline", "--nfe", "8"]) == 2  # shaped like a repo id: --output
    assert "a Hub repo id cannot be written into" in (error := capsys.readouterr().err) and "--output" in error


# --- pipeline folders ---------------------------------------------------------------------------------------------


def test_save_pretrained_refuses_another_pipelines_folder_without_overwrite(tmp_path, folders):
    target = _copy(folders, "elf", tmp_path)
    langflow = LangFlowPipeline.from_pretrained(folders / "langflow")
    with pytest.raises(FileExistsError) as error:
        langflow.save_pretrained(target)
    assert f"{target} holds another pipeline (ELFPipeline, named by {target / 'model_index.json'})" in str(error.value)
    assert "save_pretrained(..., overwrite=True)" in str(error.value)
    assert (target / "training_info.json").is_file()  # nothing was written
    langflow.save_pretrained(target, overwrite=True)
    left = {"README.md", "training_info.json", "latent_normalization.json"} & {p.name for p in target.iterdir()}
    assert left == set()
    assert type(LangFlowPipeline.from_pretrained(target)) is LangFlowPipeline


def test_save_pretrained_over_the_same_pipeline_keeps_its_other_files(tmp_path, folders):
    target = _copy(folders, "elf", tmp_path)
    ELFPipeline.from_pretrained(target).save_pretrained(target)  # e.g. after calibrate
    assert (target / "training_info.json").read_text() == "{}"


def test_model_index_without_sampler_statistics_names_the_file_and_the_entry(tmp_path, folders):
    folder = _copy(folders, "langflow", tmp_path)
    _edit_index(folder, sampler_statistics=None)
    with pytest.raises(ValueError) as error:
        LangFlowPipeline.from_pretrained(folder)
    message = str(error.value)
    assert f"{folder / 'model_index.json'} does not list the 'sampler_statistics' component" in message
    assert '"sampler_statistics": ["untied_sc.schedulers.sampler_statistics", "SamplerStatistics"]' in message


def test_model_index_without_transformer_names_the_file_and_the_entry(tmp_path, folders):
    folder = _copy(folders, "elf", tmp_path)
    _edit_index(folder, transformer=None)
    with pytest.raises(ValueError) as error:
        ELFPipeline.from_pretrained(folder)
    message = str(error.value)
    assert f"{folder / 'model_index.json'} does not list the 'transformer' component" in message
    assert '"transformer": ["untied_sc.models.elf_transformer", "ELFTransformerModel"]' in message


def test_a_statistics_tensor_of_the_wrong_shape_names_the_file_and_the_tensor(tmp_path, folders):
    folder = _copy(folders, "langflow", tmp_path)
    weights_path = folder / "sampler_statistics" / "diffusion_pytorch_model.safetensors"
    weights = load_file(weights_path)
    weights["mean_nfe8"] = torch.zeros(weights["mean_nfe8"].shape[0] + 1, weights["mean_nfe8"].shape[1])
    save_file(weights, weights_path)
    with pytest.raises(ValueError) as error:
        LangFlowPipeline.from_pretrained(folder)
    message = str(error.value)
    assert f"The sampler statistics in {folder / 'sampler_statistics'} do not fit config.json" in message
    assert "mean_nfe8 (8, 32) (expected (7, 32))" in message and "untied-sc calibrate" in message
    assert "ignore_mismatched_sizes" not in message
    from untied_sc.schedulers.sampler_statistics import SamplerStatistics

    with pytest.raises(ValueError, match=r"do not fit their config.json: mean_nfe8 expected shape"):
        SamplerStatistics.from_pretrained(folder / "sampler_statistics")


# --- coefficients -------------------------------------------------------------------------------------------------


def test_a_coefficient_that_is_not_a_number_is_refused_by_name():
    config = UntiedLangFlowScheduler().config
    with pytest.raises(
        ValueError, match=r"untied scheduler's eta_t must be a number, got 'abc' \(str\): pass e.g. `eta_t"
    ):
        UntiedLangFlowScheduler.from_config(config, eta_t="abc")


def test_a_coefficient_in_a_scheduler_file_that_is_not_a_number_names_the_file(tmp_path, folders):
    folder = _copy(folders, "langflow", tmp_path)
    path = folder / "scheduler" / "scheduler_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "_class_name": "UntiedLangFlowScheduler", "eta_t": "abc"}))
    with pytest.raises(ValueError, match=rf"eta_t in {path} must be a number"):
        LangFlowPipeline.from_pretrained(folder)


def test_coefficients_far_outside_the_papers_ranges_warn_with_the_range():
    with pytest.warns(UserWarning) as caught:
        UntiedELFScheduler(eta_t=1000.0, eta_r=1e6)
    messages = [str(w.message) for w in caught]
    assert any("eta_t = 1000 lies far outside the usual range [0, 33]" in m for m in messages)
    assert any("eta_r = 1e+06 lies far outside the usual range [0, 33]" in m for m in messages)


def test_every_paper_preset_and_the_tuners_grid_pass_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for table in paper_coefficients().values():
            for entry in table.values():
                for factor in (1.0, 2.0, 8.0):  # the sensitivity experiment's x2, three rounds of tune's x2
                    values = {k: v * factor if k != "alpha" else v for k, v in entry.items()}
                    UntiedELFScheduler(**values)


# --- ELF conversion -----------------------------------------------------------------------------------------------


def test_elf_conversion_without_a_recorded_length_requires_max_length(tmp_path, elf_golden, capsys):
    _write_official_elf_checkpoint(tmp_path / "checkpoint_7", elf_golden.weights)
    with pytest.raises(ValueError) as error:
        load_official_elf(tmp_path)
    message = str(error.value)
    assert "does not record the sequence length it was trained at" in message and "--max-length N" in message
    assert "1024 for OpenWebText" in message and "128 for WMT14 De-En" in message
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    given = ["--tokenizer", tokenizer, "--sde-gamma", "1.5", "--sc-cfg-scale", "3"]
    assert main(["convert", "elf", str(tmp_path), str(tmp_path / "out"), *given]) == 2
    assert "--max-length N (CLI)" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_elf_conversion_reads_max_length_from_the_trainers_config(tmp_path, elf_golden):
    _write_official_elf_checkpoint(tmp_path / "checkpoint_7", elf_golden.weights)
    (tmp_path / "config.yml").write_text("model: ELF-B\nmax_length: 12\nmax_input_length: null\n")
    given = ["--tokenizer", tiny_tokenizer_folder(tmp_path / "tokenizer"), "--sde-gamma", "1.5", "--sc-cfg-scale", "3"]
    assert main(["convert", "elf", str(tmp_path), str(tmp_path / "out"), *given]) == 0
    config = json.loads((tmp_path / "out" / "transformer" / "config.json").read_text())
    assert config["max_length"] == 12
    model = load_official_elf(tmp_path)
    assert model.rope_cos.shape[0] == 12 + model.num_prefix_tokens
    with pytest.raises(ValueError, match=r"--max-length 1024 \(max_length=1024\) disagrees with max_length 12 in"):
        load_official_elf(tmp_path, max_length=1024)


# --- ELF without self-conditioning --------------------------------------------------------------------------------


@torch.no_grad()
def test_elf_runs_without_its_self_conditioning_input(elf_golden):
    """
    The official fixture records no pass without self-conditioning, so this checks against an independent
    computation: the official forward on a latent-width input skips `self_cond_proj`, which is the SC-on forward
    (checked against the official recording) with `self_cond_proj` set to [I | 0] and a zero bias.
    """
    model, inputs = elf_from_golden(elf_golden), elf_golden.inputs
    latent, t, scale = inputs["latent"], inputs["t"], inputs["sc_cfg_scale"]
    no_sc = model(latent, t, None, scale, use_self_conditioning=False).sample
    reference = elf_from_golden(elf_golden)
    dim = latent.shape[-1]
    reference.self_cond_proj.weight.copy_(torch.cat([torch.eye(dim), torch.zeros(dim, dim)], dim=1))
    reference.self_cond_proj.bias.zero_()
    expected = reference(latent, t, inputs["self_cond"], scale).sample
    assert (no_sc - expected).abs().max().item() <= 1e-5
    zero_sc = model(latent, t, None, scale).sample  # a zero input still goes through self_cond_proj
    assert (no_sc - zero_sc).abs().max().item() > 1e-3
    with pytest.raises(ValueError, match="pass one or the other"):
        model(latent, t, inputs["self_cond"], scale, use_self_conditioning=False)
