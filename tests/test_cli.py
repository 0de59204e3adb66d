"""The `untied-sc` command line itself: version, help of every command, a light import, and the benchmark's refusals
(an existing result, an uncalibrated NFE) before any work."""

import argparse
import json
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc.cli import build_parser, main

from .conftest import langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every (sub)command's argv prefix, e.g. ("judge", "score")."""
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += [(*prefix, name), *command_paths(sub, (*prefix, name))]
    return paths


COMMANDS = command_paths(build_parser())


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"untied-sc {version('untied-sc')}"


def test_every_command_is_listed():
    assert {"convert", "calibrate", "tune", "evaluate", "benchmark", "judge", "data", "train"} <= {
        path[0] for path in COMMANDS
    }
    assert "migrate" not in {path[0] for path in COMMANDS}
    assert {("judge", "export"), ("judge", "run"), ("judge", "score"), ("data", "build")} <= set(COMMANDS)


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "untied-sc")
def test_help_of_every_command_exits_0(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: untied-sc" in capsys.readouterr().out


def parser_tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv prefix, parser) of `parser` and of every (sub)command under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parser_tree(sub, (*path, name))


def every_parser():
    """The whole `untied-sc` tree, and the training modules' parsers that `untied-sc train FAMILY ...` runs."""
    from untied_sc_lab.training import elf, langflow

    yield from parser_tree(build_parser())
    for family in (elf, langflow):  # the modules' own parsers: what `python -m untied_sc_lab.training.FAMILY` parses
        name = family.__name__.rsplit(".", 1)[1]
        yield from parser_tree(family.build_parser(), ("train", name))


def test_every_parser_shows_its_defaults_and_every_argument_has_help():
    checked = 0
    for path, parser in every_parser():
        assert issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter), path
        if path:  # a subcommand's help starts with what it does
            assert parser.description, path
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            if action.help == argparse.SUPPRESS:  # hidden: evaluate's refused --batch-size alone
                assert path == ("evaluate",) and action.option_strings == ["--batch-size"]
                continue
            assert action.help and action.help.strip(), (path, action.option_strings or action.dest)
            checked += 1
    assert checked > 150  # the walk reached the nested parsers (judge, data build, train's actions)


def test_help_shows_a_default_once_and_not_none(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "Samples in the tuning bank. (default: 64)" in out
    assert "Evaluator cache folder." in out and "(default: None)" not in out and "(default: False)" not in out
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("(default: 2000)") == 1 and "(default: 32)" in out  # --seed, --base-scale-bank-size


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_help_of_every_training_action_exits_0(family, capsys):
    from importlib import import_module

    actions = next(a for a in import_module(f"untied_sc_lab.training.{family}").build_parser()._actions if a.choices)
    for action in actions.choices:
        with pytest.raises(SystemExit) as exit_:
            main(["train", family, action, "--help"])
        assert exit_.value.code == 0
        assert f"untied_sc_lab.training.{family} {action}" in capsys.readouterr().out


def test_train_help_lists_every_action_and_where_it_runs(capsys):
    import dataclasses
    import re

    from untied_sc_lab.training import elf, langflow

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for family in (elf, langflow):
        name = family.__name__.rsplit(".", 1)[1]
        actions = next(a for a in family.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        for action in actions.choices:
            assert re.search(rf"^  {name} {action} +\S", out, re.M), (name, action)  # one line each
    line = {m[1]: m[2] for m in re.finditer(r"^  (\w+ \w+) +(.*)$", out, re.M)}
    # where each trains, as the configs say: both families' configs have a device, the CPU by default
    assert "CPU only" not in out
    for name, config_class in (("elf", elf.ELFTrainConfig), ("langflow", langflow.LangFlowTrainConfig)):
        assert "device" in {f.name for f in dataclasses.fields(config_class)} and config_class.device == "cpu"
        assert "CPU by default" in line[f"{name} train"] and "--device cuda" in line[f"{name} train"]
        with pytest.raises(SystemExit):
            main(["train", name, "train", "--help"])
        assert "--device DEVICE" in capsys.readouterr().out


def test_options_that_run_a_model_or_show_progress():
    """--device where a command runs a network, --no-progress where it shows a progress bar."""
    options = {path: {o for a in p._actions for o in a.option_strings} for path, p in parser_tree(build_parser())}
    for command in [("calibrate",), ("tune",), ("benchmark",), ("generate",)]:
        assert {"--device", "--no-progress"} <= options[command], command
    assert "--device" in options[("evaluate",)]
    assert "--no-progress" in options[("judge", "run")]


def test_evaluate_refuses_batch_size_and_names_eval_batch_size(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "samples.jsonl", "--batch-size", "4"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "evaluate's evaluator batch is --eval-batch-size" in error
    assert "--batch-size means the pipeline batch in calibrate/tune/benchmark/generate" in error
    args = build_parser().parse_args(["evaluate", "samples.jsonl", "--eval-batch-size", "4"])
    assert args.eval_batch_size == 4 and not hasattr(args, "batch_size")
    # the evaluator batch has one name in every command that has one
    assert build_parser().parse_args(["tune", "p", "--nfe", "8", "--eval-batch-size", "4"]).eval_batch_size == 4
    assert build_parser().parse_args(["benchmark", "p", "--eval-batch-size", "4"]).eval_batch_size == 4


def test_building_the_cli_parsers_does_not_import_torch():
    """What keeps `untied-sc --help` fast: the parsers import only argparse-level modules; handlers import the rest."""
    code = (
        "import sys, untied_sc.cli; untied_sc.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "untied-sc")
def test_help_of_every_command_does_not_import_torch(command):
    """`untied-sc [COMMAND ...] --help` answers from the parsers alone, in a fresh interpreter: torch never loads."""
    code = (
        "import sys, untied_sc.cli\n"
        "try:\n"
        f"    untied_sc.cli.main({[*command, '--help']!r})\n"
        "except SystemExit as exit_:\n"
        "    print(exit_.code, sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "usage: untied-sc" in out and out.strip().endswith("0 []")


@pytest.mark.parametrize("argv", [["train", "elf", "--help"], ["train", "langflow", "train", "--help"]])
def test_training_help_does_not_import_torch(argv):
    """`untied-sc train FAMILY [ACTION] --help` parses with the light `untied_sc_lab.training.cli`: no torch to load."""
    code = (
        "import sys, untied_sc.cli\n"
        "try:\n"
        f"    untied_sc.cli.main({argv!r})\n"
        "except SystemExit:\n"
        "    print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "usage: python -m untied_sc_lab.training" in out and out.strip().endswith("[]")


def test_train_refuses_a_family_the_lab_does_not_train(capsys):
    """The lab's table of trained families (keyed by the library's names) answers `untied-sc train`: a family of the
    library without training, or no family at all, is refused in one line naming the families it trains."""
    from untied_sc.families import family_names
    from untied_sc_lab.training import cli as training_cli

    trained = training_cli.TRAINING
    assert set(trained) == {"elf", "langflow"} and set(trained) <= set(family_names())
    for family, training in trained.items():
        assert training_cli.build_parser(family).prog == f"python -m {training.module}"
    assert main(["train", "flowmap"]) == 2
    assert "flow-map (FMLM*, ELF*) family has no training in the lab; `untied-sc train` trains elf, langflow" in (
        capsys.readouterr().err
    )
    assert main(["train", "gpt"]) == 2
    assert "Unknown model family 'gpt'; `untied-sc train` trains elf, langflow" in capsys.readouterr().err


@pytest.fixture(scope="module")
def saved(tmp_path_factory, langflow_golden):
    """A LangFlow pipeline calibrated at NFE 8 only, and a tiny evaluator, saved as folders."""
    folder = tmp_path_factory.mktemp("cli")
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    pipe.save_pretrained(folder / "tiny-langflow")
    for part in tiny_evaluator():
        part.save_pretrained(folder / "evaluator")
    return folder


@pytest.fixture
def pipeline_calls(monkeypatch):
    """Counts the pipeline calls (sampling) of a command."""
    calls = []
    original = LangFlowPipeline.__call__

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("num_inference_steps"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LangFlowPipeline, "__call__", spy)
    return calls


def benchmark_argv(saved, output_dir, *extra):
    argv = ["benchmark", str(saved / "tiny-langflow"), "--seeds", "0", "--num-samples", "2", "--batch-size", "2"]
    argv += ["--evaluator", str(saved / "evaluator"), "--num-resamples", "20", "--no-progress"]
    return [*argv, "--output-dir", str(output_dir), *extra]


def test_benchmark_refuses_an_existing_result_before_any_work_and_replaces_it_with_overwrite(
    tmp_path, saved, pipeline_calls, capsys
):
    results = tmp_path / "results"
    results.mkdir()
    existing = results / "tiny-langflow.md"
    existing.write_text("an earlier result\n")
    assert main(benchmark_argv(saved, results, "--nfe", "8")) == 2
    error = capsys.readouterr().err
    assert str(existing) in error and "--overwrite" in error and "--name" in error
    assert pipeline_calls == [] and existing.read_text() == "an earlier result\n"
    assert sorted(p.name for p in results.iterdir()) == ["tiny-langflow.md"]

    assert main(benchmark_argv(saved, results, "--nfe", "8", "--name", "other")) == 0  # another name writes beside it
    assert existing.read_text() == "an earlier result\n" and (results / "other.json").is_file()

    pipeline_calls.clear()
    assert main(benchmark_argv(saved, results, "--nfe", "8", "--overwrite")) == 0
    assert pipeline_calls and existing.read_text() != "an earlier result\n"
    saved_results = json.loads((results / "tiny-langflow.json").read_text())
    assert "--overwrite" not in saved_results["command"]  # it does not change what the results are


def test_benchmark_generate_only_needs_a_store_before_any_work(tmp_path, saved, pipeline_calls):
    with pytest.raises(SystemExit, match=r"--generate-only .*: give the run store that carries it, --store DIR \("):
        main(benchmark_argv(saved, tmp_path, "--nfe", "8", "--generate-only"))
    assert pipeline_calls == [] and list(tmp_path.iterdir()) == []


def test_benchmark_checks_every_nfe_before_sampling(tmp_path, saved, pipeline_calls, capsys):
    assert main(benchmark_argv(saved, tmp_path, "--nfe", "8", "12")) == 2
    error = capsys.readouterr().err
    assert "NFE 12" in error and "NFE 8 " not in error and "calibrated NFEs: [8]" in error
    assert f"untied-sc calibrate {saved / 'tiny-langflow'} --nfe 12" in error
    assert pipeline_calls == []  # nothing was sampled at NFE 8 first
    assert list(tmp_path.iterdir()) == []


def test_benchmark_refuses_leaked_seeds_before_sampling(tmp_path, saved, pipeline_calls, capsys):
    old = tmp_path / "old"
    shutil.copytree(saved / "tiny-langflow", old)
    config_path = old / "sampler_statistics" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "seeds": {"8": [4000, 4001]}}))  # calibrated before the seed spaces
    argv = benchmark_argv(saved, tmp_path / "results", "--nfe", "8")
    argv[1], argv[argv.index("--seeds") + 1] = str(old), "4000"
    assert main(argv) == 2
    assert "leak" in capsys.readouterr().err and pipeline_calls == []


def test_evaluate_scores_with_the_eval_batch_size(tmp_path, saved, monkeypatch, capsys):
    from untied_sc.generation import Sample, write_samples
    from untied_sc_lab.evaluation import io

    batch_sizes = []
    original = io.evaluate_samples

    def spy(samples, **options):
        batch_sizes.append(options["batch_size"])
        return original(samples, **options)

    monkeypatch.setattr(io, "evaluate_samples", spy)
    samples = tmp_path / "samples.jsonl"
    write_samples(samples, [Sample("w3 w4 w5"), Sample("w6 w7")])
    argv = ["evaluate", str(samples), "--evaluator", str(saved / "evaluator"), "--eval-batch-size", "1"]
    argv += ["--protocol", "langflow"]
    assert main(argv) == 0
    assert batch_sizes == [1] and "GenPPL" in capsys.readouterr().out


def test_tune_runs_the_pipeline_and_the_evaluator_on_its_device(tmp_path, saved, monkeypatch, capsys):
    from untied_sc_lab.tuning import tune

    calls, moves = [], []
    original_to = LangFlowPipeline.to

    def to(self, *args, **kwargs):
        moves.append(str(args[0]) if args else kwargs.get("device"))
        return original_to(self, *args, **kwargs)

    def fake_tune(pipe, **options):
        calls.append(options)
        return []

    monkeypatch.setattr(LangFlowPipeline, "to", to)
    monkeypatch.setattr(tune, "tune_coefficients", fake_tune)
    argv = ["tune", str(saved / "tiny-langflow"), "--nfe", "8", "--output", str(tmp_path / "out"), "--no-progress"]
    assert main([*argv, "--device", "cpu"]) == 0
    assert moves[0] == "cpu" and calls[0]["device"] == "cpu" and calls[0]["progress"] is False
    assert (tmp_path / "out" / "model_index.json").is_file()


def test_convert_and_calibrate_never_write_into_an_existing_folder(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "result.json").write_text("{}")
    assert main(["convert", "langflow", str(tmp_path / "no-such-checkpoint"), str(taken)]) == 2
    assert "taken already exists and is not empty; pass --overwrite to replace it" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path), "--nfe", "8", "--output", str(taken)]) == 2
    assert "leave out --output to update the pipeline folder in place" in capsys.readouterr().err
    assert (taken / "result.json").read_text() == "{}"


# ---- nothing a user made is replaced without --overwrite, nor written through a link ------------------------------


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_loading(monkeypatch):
    """Fails a command that gets as far as loading the pipeline (its refusals come before any work)."""
    import untied_sc.pipelines

    def refuse(*args, **kwargs):
        raise AssertionError("the pipeline was loaded")

    monkeypatch.setattr(untied_sc.pipelines, "load_pipeline", refuse)


def calibrate_argv(folder, *extra):
    return ["calibrate", str(folder), "--bank-size", "2", "--batch-size", "2", "--no-progress", *extra]


def test_calibrate_refuses_to_replace_calibrated_nfes_without_overwrite_and_adds_new_ones(tmp_path, saved, capsys):
    folder = tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", folder)
    before = _files(folder)
    for nfe in (["8"], ["8", "12"]):
        assert main(calibrate_argv(folder, "--nfe", *nfe)) == 2
        error = capsys.readouterr().err
        assert f"{folder / 'sampler_statistics'} already holds statistics for NFE 8 (calibrated NFEs: 8)" in error
        assert "Pass --overwrite to replace them" in error and "--output NEW_FOLDER" in error
        assert ("(--nfe 12)" in error) == (nfe == ["8", "12"])
        assert _files(folder) == before

    # a new NFE is added beside the calibrated one without --overwrite, which stays as it was
    assert main(calibrate_argv(folder, "--nfe", "12")) == 0
    from untied_sc.pipelines import load_pipeline

    pipe = load_pipeline(folder)
    old = load_pipeline(saved / "tiny-langflow").sampler_statistics
    assert pipe.sampler_statistics.config.calibrated_steps == [8, 12]
    assert pipe.sampler_statistics.config.bank_sizes == {"8": [4, 4], "12": [2, 2]}
    assert pipe.sampler_statistics.for_steps(8).rms.equal(old.for_steps(8).rms)

    # --overwrite replaces NFE 8, and keeps NFE 12
    assert main(calibrate_argv(folder, "--nfe", "8", "--overwrite")) == 0
    config = load_pipeline(folder).sampler_statistics.config
    assert config.calibrated_steps == [8, 12] and config.bank_sizes == {"8": [2, 2], "12": [2, 2]}


def test_calibrate_with_coefficients_refuses_to_replace_tuned_ones_and_overwrite_replaces_them(
    tmp_path, saved, capsys
):
    folder = tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", folder)
    scheduler_path = folder / "scheduler" / "scheduler_config.json"
    scheduler = json.loads(scheduler_path.read_text())
    tuned = {"eta_r": 0.4, "eta_t": 0.3, "eta_o": 1.0, "alpha": 0.7, "temperature": 0.9}
    scheduler["coefficients_by_steps"] = {"8": tuned}
    scheduler["tuning_by_steps"] = {"8": {"num_samples": 64}}
    scheduler_path.write_text(json.dumps(scheduler))
    shutil.rmtree(folder / "sampler_statistics")  # NFE 8 uncalibrated: only the coefficients are in the way
    index = json.loads((folder / "model_index.json").read_text())
    index.pop("sampler_statistics")
    (folder / "model_index.json").write_text(json.dumps(index))
    explicit = ["--eta-r", "1.0", "--eta-t", "1.0", "--eta-o", "1.0", "--alpha", "0.5"]
    assert main(calibrate_argv(folder, "--nfe", "8", *explicit)) == 2
    error = capsys.readouterr().err
    assert f"{scheduler_path} already holds tuned coefficients for NFE 8" in error and "--overwrite" in error
    assert json.loads(scheduler_path.read_text())["coefficients_by_steps"] == {"8": tuned}

    assert main(calibrate_argv(folder, "--nfe", "8", *explicit, "--overwrite")) == 0
    written = json.loads(scheduler_path.read_text())
    assert written["coefficients_by_steps"] == {"8": {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 0.5}}
    assert not written.get("tuning_by_steps")  # the record of the tuning it replaced went with it


def test_pipe_calibrate_keeps_other_coefficients_with_a_warning_unless_overwrite(saved):
    from untied_sc.pipelines import load_pipeline

    pipe = load_pipeline(saved / "tiny-langflow")
    kept = dict(pipe.scheduler.config.coefficients_by_steps["8"])
    explicit = {8: {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 0.5}}
    options = {"bank_size": 2, "batch_size": 2, "progress": False, "coefficients": explicit}
    with pytest.warns(UserWarning, match="keeps its coefficients for NFE 8.*overwrite=True"):
        pipe.calibrate(nfe=[8], **options)
    assert pipe.scheduler.config.coefficients_by_steps["8"] == kept
    pipe.calibrate(nfe=[8], overwrite=True, **options)
    assert pipe.scheduler.config.coefficients_by_steps["8"] == explicit[8]


def test_tune_refuses_to_replace_tuned_coefficients_without_overwrite(tmp_path, saved, monkeypatch, capsys):
    from untied_sc_lab.tuning import tune

    folder = tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", folder)
    calls = []
    monkeypatch.setattr(tune, "tune_coefficients", lambda pipe, **options: calls.append(options) or [])
    argv = ["tune", str(folder), "--nfe", "8", "--num-samples", "2", "--no-progress"]
    assert main(argv) == 0 and len(calls) == 1  # calibration's (preset) coefficients are tuning's to replace

    scheduler_path = folder / "scheduler" / "scheduler_config.json"
    scheduler = json.loads(scheduler_path.read_text())
    scheduler["coefficients_by_steps"]["8"]["temperature"] = 0.93
    scheduler["tuning_by_steps"] = {"8": {"num_samples": 64}}
    scheduler_path.write_text(json.dumps(scheduler))
    before = _files(folder)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"{scheduler_path} already holds tuned coefficients (NFE 8: tuned on 64 samples, temperature 0.93)" in error
    assert "Pass --overwrite to replace them" in error and "--output NEW_FOLDER" in error
    assert len(calls) == 1 and _files(folder) == before
    assert main([*argv, "--overwrite"]) == 0 and len(calls) == 2


def test_calibrate_overwrite_replaces_statistics_that_cannot_be_loaded(tmp_path, saved, capsys):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", folder)
    weights = folder / "sampler_statistics" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    name = next(key for key in tensors if tensors[key].is_floating_point() and tensors[key].numel())
    tensors[name] = tensors[name].clone().fill_(float("nan"))
    save_file(tensors, weights)
    assert main(calibrate_argv(folder, "--nfe", "8")) == 2
    assert "--overwrite" in capsys.readouterr().err  # refused: NFE 8 is calibrated
    assert main(calibrate_argv(folder, "--nfe", "8", "--overwrite")) == 0  # as the NaN error tells the user
    assert "cannot be loaded" in capsys.readouterr().err

    from untied_sc.pipelines import load_pipeline

    assert load_pipeline(folder).sampler_statistics.config.calibrated_steps == [8]


@pytest.mark.parametrize(
    "link", ["sampler_statistics", "scheduler", "scheduler/scheduler_config.json", "model_index.json"]
)
def test_calibrate_and_tune_never_write_through_a_link_out_of_the_folder(tmp_path, saved, no_loading, link, capsys):
    other, folder = tmp_path / "other", tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", other)
    shutil.copytree(saved / "tiny-langflow", folder)
    target = other / link
    path = folder / link
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(target)
    before = _files(other)
    for argv in (calibrate_argv(folder, "--nfe", "12"), ["tune", str(folder), "--nfe", "8"]):
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert f"{path} is a symbolic link to {target} ({target.resolve()}), outside {folder}" in error
        assert "--output NEW_FOLDER" in error
    assert _files(other) == before


def test_a_link_inside_the_folder_is_followed(tmp_path, saved):
    folder = tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", folder)
    (folder / "sampler_statistics").rename(folder / "statistics-v1")
    (folder / "sampler_statistics").symlink_to("statistics-v1")
    assert main(calibrate_argv(folder, "--nfe", "12")) == 0
    assert json.loads((folder / "statistics-v1" / "config.json").read_text())["calibrated_steps"] == [8, 12]


def test_ace_and_save_sampler_statistics_never_write_through_a_link_out_of_the_folder(tmp_path, saved):
    from untied_sc.input_checks import check_writes_stay_inside
    from untied_sc.pipelines import load_pipeline
    from untied_sc.pipelines.loading import save_sampler_statistics

    other, folder = tmp_path / "other", tmp_path / "pipe"
    shutil.copytree(saved / "tiny-langflow", other)
    shutil.copytree(saved / "tiny-langflow", folder)
    pipe = load_pipeline(folder)
    (folder / "model_index.json").unlink()
    (folder / "model_index.json").symlink_to(other / "model_index.json")
    before = _files(other)
    with pytest.raises(ValueError, match="model_index.json is a symbolic link to .*outside"):
        save_sampler_statistics(pipe, folder)
    assert main(["ace", str(folder)]) == 2
    (folder / "ace_statistics").symlink_to(other)
    with pytest.raises(ValueError, match=r"ace_statistics is a symbolic link .* `untied-sc ace` would write"):
        check_writes_stay_inside(folder, ["ace_statistics/config.json"], "`untied-sc ace`")
    assert _files(other) == before


# ---- two runs writing one output cannot both succeed --------------------------------------------------------------


def test_claimed_outputs_refuse_a_second_writer_and_free_the_file_when_done(tmp_path):
    from untied_sc.output_paths import claimed_outputs, lock_path

    out = tmp_path / "deep" / "samples.jsonl"
    with claimed_outputs([out], False, "choose another --out"):
        assert lock_path(out).is_file()
        with pytest.raises(FileExistsError) as error, claimed_outputs([out], True, "choose another --out"):
            pass
        message = str(error.value)
        assert f"{out} is being written by another run (pid " in message and str(lock_path(out)) in message
        assert "choose another --out" in message
        out.write_text("one run's samples\n")
    assert not lock_path(out).exists()
    with pytest.raises(FileExistsError, match="exists; pass --overwrite"), claimed_outputs([out], False, "x"):
        pass
    with claimed_outputs([out], True, "x"):  # a run that ended (or crashed) leaves no claim behind
        pass
    lock_path(out).write_text("pid 1 on a crashed run\n")  # a lock file nobody holds is no claim
    with claimed_outputs([out], True, "x"):
        pass
    with claimed_outputs([out], False, "x", active=False):  # a process that writes nothing claims nothing
        assert not lock_path(out).exists()


@pytest.mark.parametrize("command", ["generate", "evaluate", "benchmark"])
def test_a_second_run_writing_the_same_output_is_refused_before_any_work(
    tmp_path, saved, pipeline_calls, command, capsys
):
    from untied_sc.generation import Sample, write_samples
    from untied_sc.output_paths import claimed_outputs

    samples = tmp_path / "samples.jsonl"
    write_samples(samples, [Sample("w3 w4 w5"), Sample("w6 w7")])
    pipeline = str(saved / "tiny-langflow")
    runs = {
        "generate": (
            ["generate", pipeline, "--nfe", "8", "--num-samples", "2", "--out", str(tmp_path / "o.jsonl")],
            tmp_path / "o.jsonl",
        ),
        "evaluate": (
            [
                "evaluate",
                str(samples),
                "--protocol",
                "langflow",
                "--evaluator",
                str(saved / "evaluator"),
                "--output",
                str(tmp_path / "o.json"),
            ],
            tmp_path / "o.json",
        ),
        "benchmark": (
            benchmark_argv(saved, tmp_path / "results", "--nfe", "8"),
            tmp_path / "results" / "tiny-langflow.md",
        ),
    }
    argv, out = runs[command]
    with claimed_outputs([out], True, "x"):  # another run writing it now
        assert main([*argv, "--overwrite"]) == 2
        error = capsys.readouterr().err
        assert f"{out} is being written by another run" in error and "Wait for that run to finish" in error
        assert not out.exists() and pipeline_calls == []
    assert main(argv) == 0  # once that run is done, the file is free
    assert out.is_file() and "Wrote" in capsys.readouterr().out
