"""The `untied-sc` command line itself: version, help of every command, a light import, and the benchmark's refusals
(an existing result, an uncalibrated NFE) before any work."""

import argparse
import json
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
    assert {"convert", "calibrate", "tune", "migrate", "evaluate", "benchmark", "judge", "data", "train"} <= {
        path[0] for path in COMMANDS
    }
    assert {("judge", "export"), ("judge", "run"), ("judge", "score"), ("data", "build")} <= set(COMMANDS)


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "untied-sc")
def test_help_of_every_command_exits_0(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: untied-sc" in capsys.readouterr().out


def test_building_the_cli_parsers_does_not_import_torch():
    """What keeps `untied-sc --help` fast: the parsers import only argparse-level modules; handlers import the rest."""
    code = (
        "import sys, untied_sc.cli; untied_sc.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


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


def test_benchmark_generate_only_refuses_an_existing_generation(tmp_path, saved, pipeline_calls, capsys):
    (tmp_path / "tiny-langflow.generation-samples.jsonl.gz").write_bytes(b"")
    assert main(benchmark_argv(saved, tmp_path, "--nfe", "8", "--generate-only")) == 2
    assert "tiny-langflow.generation-samples.jsonl.gz" in capsys.readouterr().err and pipeline_calls == []


def test_benchmark_checks_every_nfe_before_sampling(tmp_path, saved, pipeline_calls, capsys):
    assert main(benchmark_argv(saved, tmp_path, "--nfe", "8", "12")) == 2
    error = capsys.readouterr().err
    assert "NFE 12" in error and "NFE 8 " not in error and "calibrated NFEs: [8]" in error
    assert f"untied-sc calibrate {saved / 'tiny-langflow'} --nfe 12" in error
    assert pipeline_calls == []  # nothing was sampled at NFE 8 first
    assert list(tmp_path.iterdir()) == []


def test_benchmark_refuses_leaked_seeds_before_sampling(tmp_path, saved, pipeline_calls, capsys):
    argv = benchmark_argv(saved, tmp_path, "--nfe", "8")
    argv[argv.index("--seeds") + 1] = "4000"  # a calibration bank of the default calibration seed 2000
    assert main(argv) == 2
    assert "leak" in capsys.readouterr().err and pipeline_calls == []
