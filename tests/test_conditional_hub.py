"""The whole path of a conditional checkpoint over real HTTP against the local Hub (`tests/hub_server.py`), in fresh
processes that patch nothing: the local Hub serves `embedded-language-flows/ELF-B-de-en-torch` laid out as the
released repo is (one `checkpoint_<step>` of the trainer, no config.yml, a model card) and `t5-small` (a tokenizer and
a T5 encoder), tiny stand-ins that the convert table's real lengths apply to, 128 positions of which 64 are the
source; the first user converts it by repo id, calibrates on prompts and pushes the statistics only; the second, with
an empty cache, loads the base with the published statistics and samples untied at 8 steps from a prompt.

The network is the official conditional recording's tiny weights: ELF has no learned positions (RoPE), so they run at
the released length as they do at the recorded 12.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from untied_sc import ELFText2TextPipeline, UntiedELFScheduler

from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_conditional_convert import encoder_folder
from .test_convert_pipeline import official_elf_checkpoint
from .test_hub_http import hub, loopback_guard  # noqa: F401  (fixtures)
from .test_pipelines_conditional import GOLDEN
from .tiny import tiny_tokenizer_folder


ROOT = Path(__file__).resolve().parents[1]
DE_EN = "embedded-language-flows/ELF-B-de-en-torch"
STATISTICS_REPO = "someone/elf-b-de-en-untied-sc"
PROMPTS = GOLDEN.run["prompts"]

LOAD = """
import json, sys, torch
from untied_sc import ELFText2TextPipeline, UntiedELFScheduler

base, stats, official = sys.argv[1:4]
prompts = json.loads(sys.argv[4])
results = {}
for name, pipe in (
    ("from_pretrained", ELFText2TextPipeline.from_pretrained(base, sampler_statistics=stats)),
    ("from_official", ELFText2TextPipeline.from_official(official, sampler_statistics=stats)),
):
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = UntiedELFScheduler.from_config(pipe.scheduler.config)
    out = pipe(prompt=prompts, num_inference_steps=8, generator=torch.Generator().manual_seed(0))
    results[name] = {"texts": out.texts, "scheduler": type(pipe.scheduler).__name__,
                     "coefficients": pipe.scheduler.config.coefficients_by_steps,
                     "prompt_banks": pipe.sampler_statistics.config.prompt_banks,
                     "lengths": [pipe.transformer.config.max_length, pipe.config.max_source_length]}
print("RESULT " + json.dumps(results))
"""


def de_en_repo(folder: Path) -> Path:
    """ELF-B-de-en-torch's repo layout: a `checkpoint_<step>` file and a model card, nothing that says a length."""
    official_elf_checkpoint(folder / "checkpoint_5", GOLDEN.weights)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# ELF-B (WMT14 De-En), a tiny stand-in\n")
    return folder


def t5_small_repo(folder: Path, scratch: Path) -> Path:
    """t5-small's repo for what the conditional path loads from it: its tokenizer and a T5 encoder (the tiny
    recording's, `config.json` and weights), one repo as the real one holds both."""
    folder.mkdir(parents=True)
    for part in (Path(tiny_tokenizer_folder(scratch / "tokenizer")), Path(encoder_folder(scratch / "encoder"))):
        for file in part.iterdir():
            shutil.copy(file, folder / file.name)
    return folder


def _run(env: dict, cwd: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_convert_calibrate_on_prompts_push_statistics_then_sample_untied_with_a_prompt(
    hub,  # noqa: F811
    loopback_guard,  # noqa: F811
    tmp_path,
    one_thread,
):
    official_commit = hub.commit(DE_EN, de_en_repo(tmp_path / "de-en-repo"), "the official weights")
    hub.commit("t5-small", t5_small_repo(tmp_path / "t5-small-repo", tmp_path / "t5-parts"), "t5-small")
    entry_point = Path(sys.executable).with_name("untied-sc")
    cli = [str(entry_point)] if entry_point.is_file() else [sys.executable, "-m", "untied_sc.cli"]
    closed = "http://127.0.0.1:9"  # a proxy nobody answers at: any host but the local Hub is unreachable
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf-home-1"),
        "HF_HUB_CACHE": str(tmp_path / "cache-first-user"),
        "HF_TOKEN": "hf_local_test_token",
        "NO_PROXY": "127.0.0.1,localhost",
        **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), closed),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "OMP_NUM_THREADS": "1",  # torch on one thread: on a machine whose cores are busy a second one only waits
    }
    first_user, second_user = tmp_path / "first-user", tmp_path / "second-user"
    first_user.mkdir(), second_user.mkdir()

    # The first user: convert by repo id (t5-small from the Hub), calibrate on the prompt file, push the statistics.
    (first_user / "sources.txt").write_text("\n".join(PROMPTS) + "\n")
    _run(env, first_user, *cli, "convert", "elf", DE_EN, "elf-b-de-en")
    converted = first_user / "elf-b-de-en"
    recorded = json.loads((converted / "converted_from.json").read_text())
    assert (recorded["repo_id"], recorded["commit"], recorded["max_length"]) == (DE_EN, official_commit, 128)
    index = json.loads((converted / "model_index.json").read_text())
    assert index["_class_name"][-1] == "ELFText2TextPipeline" and index["max_source_length"] == 64
    assert json.loads((converted / "transformer" / "config.json").read_text())["max_length"] == 128
    calibrate = ["calibrate", "elf-b-de-en", "--nfe", "8", "--prompts", "sources.txt", "--no-progress"]
    pushed = _run(env, first_user, *cli, *calibrate, "--push-statistics-to", STATISTICS_REPO)
    assert f"Pushed the sampler statistics and coefficients to {STATISTICS_REPO}" in pushed.stdout
    files = set(hub.files(STATISTICS_REPO)) - {".gitattributes"}
    assert "sampler_statistics/config.json" in files and not any(f.startswith("transformer") for f in files)
    assert not any(f.startswith("text_encoder") for f in files)
    card = (first_user / "elf-b-de-en-statistics" / "README.md").read_text()
    assert f"untied-sc convert elf {DE_EN} BASE_DIR" in card and "pipe(prompt=" in card

    # The second user, with an empty cache: convert the official weights, load them with the published statistics.
    env = {**env, "HF_HOME": str(tmp_path / "hf-home-2"), "HF_HUB_CACHE": str(tmp_path / "cache-second-user")}
    _run(env, second_user, *cli, "convert", "elf", DE_EN, "elf-b-de-en")
    mine = second_user / "elf-b-de-en"
    assert not (mine / "sampler_statistics").exists()
    done = _run(env, second_user, sys.executable, "-c", LOAD, str(mine), STATISTICS_REPO, DE_EN, json.dumps(PROMPTS))
    results = json.loads(done.stdout.split("RESULT ", 1)[1])
    cached = {p.name for p in (tmp_path / "cache-second-user").iterdir() if p.name.startswith("models--")}
    assert cached == {f"models--{repo.replace('/', '--')}" for repo in (DE_EN, "t5-small", STATISTICS_REPO)}

    first = ELFText2TextPipeline.from_pretrained(converted)  # the first user's calibrated folder, in this process
    first.set_progress_bar_config(disable=True)
    expected = first.scheduler.config.coefficients_by_steps
    first.scheduler = UntiedELFScheduler.from_config(first.scheduler.config)
    reference = first(prompt=PROMPTS, num_inference_steps=8, generator=torch.Generator().manual_seed(0)).texts
    bank_record = {"file": "sources.txt", "count": len(PROMPTS)}
    for name, result in results.items():
        assert result["scheduler"] == "UntiedELFScheduler", name
        assert result["lengths"] == [128, 64], name
        assert result["coefficients"] == expected and result["coefficients"]["8"]["eta_t"] > 0, name
        assert {k: result["prompt_banks"]["8"][k] for k in bank_record} == bank_record, name
        assert len(result["texts"]) == len(PROMPTS), name
        assert result["texts"] == reference, name  # the same statistics and coefficients: the same samples
