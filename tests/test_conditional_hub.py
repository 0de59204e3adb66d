"""The whole path of a conditional checkpoint over real HTTP against the local Hub (`tests/hub_server.py`), in fresh
processes: the official repo's layout under its real id (`embedded-language-flows/ELF-B-de-en-torch`, a
`checkpoint_<step>` file) holding the official conditional recording's tiny weights; the first user converts it by
repo id, calibrates on prompts and pushes the statistics only; the second, with an empty cache, loads the base with
the published statistics and samples untied at 8 steps from a prompt.

The tiny weights have 12 positions, 6 of them the source, where the released model has 128 and 64: each process
runs the command line with the table's two lengths set to the tiny ones (`TINY_TABLE`), nothing else changed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from untied_sc import ELFText2TextPipeline, UntiedELFScheduler

from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_conditional_convert import encoder_folder
from .test_convert_pipeline import official_elf_checkpoint
from .test_hub_http import hub, loopback_guard, loopback_only, point_hub_at  # noqa: F401  (fixtures)
from .test_pipelines_conditional import GOLDEN
from .tiny import tiny_tokenizer_folder


ROOT = Path(__file__).resolve().parents[1]
DE_EN = "embedded-language-flows/ELF-B-de-en-torch"
STATISTICS_REPO = "someone/elf-b-de-en-untied-sc"
PROMPTS = GOLDEN.run["prompts"]

TINY_TABLE = f"""
import dataclasses
from untied_sc.models import official_checkpoints as table
from untied_sc.models.official_checkpoints import Sourced

record = table._BY_ID[{DE_EN.lower()!r}]
source_length = Sourced({GOLDEN.run["max_input_length"]}, record.conditioning.max_source_length.source)
table._BY_ID[{DE_EN.lower()!r}] = dataclasses.replace(
    record,
    max_length=Sourced({GOLDEN.run["max_length"]}, record.max_length.source),
    conditioning=dataclasses.replace(record.conditioning, max_source_length=source_length),
)
"""
CLI = TINY_TABLE + "\nimport sys\nfrom untied_sc.cli import main\nsys.exit(main(sys.argv[1:]))\n"
LOAD = (
    TINY_TABLE
    + """
import json, sys, torch
from untied_sc import ELFText2TextPipeline, UntiedELFScheduler

base, stats, official, tokenizer, encoder = sys.argv[1:6]
prompts = json.loads(sys.argv[6])
results = {}
for name, pipe in (
    ("from_pretrained", ELFText2TextPipeline.from_pretrained(base, sampler_statistics=stats)),
    ("from_official", ELFText2TextPipeline.from_official(
        official, tokenizer=tokenizer, text_encoder=encoder, sampler_statistics=stats)),
):
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = UntiedELFScheduler.from_config(pipe.scheduler.config)
    out = pipe(prompt=prompts, num_inference_steps=8, generator=torch.Generator().manual_seed(0))
    results[name] = {"texts": out.texts, "scheduler": type(pipe.scheduler).__name__,
                     "coefficients": pipe.scheduler.config.coefficients_by_steps,
                     "prompt_banks": pipe.sampler_statistics.config.prompt_banks}
print("RESULT " + json.dumps(results))
"""
)


def _run(env: dict, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_convert_calibrate_on_prompts_push_statistics_then_sample_untied_with_a_prompt(hub, tmp_path):  # noqa: F811
    official = tmp_path / "official"
    official_elf_checkpoint(official / "checkpoint_5", GOLDEN.weights)
    official_commit = hub.commit(DE_EN, official, "the official weights")
    tokenizer, encoder = tiny_tokenizer_folder(tmp_path / "tokenizer"), encoder_folder(tmp_path / "t5")
    bank = tmp_path / "sources.txt"
    bank.write_text("\n".join(PROMPTS) + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_CACHE": str(tmp_path / "cache-first-user"),
        "HF_TOKEN": "hf_local_test_token",
        "NO_PROXY": "127.0.0.1,localhost",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    components = ["--tokenizer", tokenizer, "--text-encoder", encoder]

    # The first user: convert by repo id, calibrate on the prompt file, push the statistics only.
    converted = tmp_path / "elf-b-de-en"
    _run(env, "-c", CLI, "convert", "elf", DE_EN, str(converted), *components)
    recorded = json.loads((converted / "converted_from.json").read_text())
    assert (recorded["repo_id"], recorded["commit"]) == (DE_EN, official_commit)
    assert json.loads((converted / "model_index.json").read_text())["_class_name"][-1] == "ELFText2TextPipeline"
    calibrate = ["calibrate", str(converted), "--nfe", "8", "--bank-size", "4", "--batch-size", "2", "--no-progress"]
    small = ["--base-scale-bank-size", "2", "--base-scale-steps", "4", "--prompts", str(bank)]
    pushed = _run(env, "-c", CLI, *calibrate, *small, "--push-statistics-to", STATISTICS_REPO)
    assert f"Pushed the sampler statistics and coefficients to {STATISTICS_REPO}" in pushed.stdout
    files = set(hub.files(STATISTICS_REPO)) - {".gitattributes"}
    assert "sampler_statistics/config.json" in files and not any(f.startswith("transformer") for f in files)
    assert not any(f.startswith("text_encoder") for f in files)
    card = (Path(f"{converted}-statistics") / "README.md").read_text()
    assert f"untied-sc convert elf {DE_EN} BASE_DIR" in card and "pipe(prompt=" in card

    # The second user, with an empty cache: convert the official weights, load them with the published statistics.
    env["HF_HUB_CACHE"] = str(tmp_path / "cache-second-user")
    mine = tmp_path / "second-user" / "elf-b-de-en"
    _run(env, "-c", CLI, "convert", "elf", DE_EN, str(mine), *components)
    assert not (mine / "sampler_statistics").exists()
    done = _run(env, "-c", LOAD, str(mine), STATISTICS_REPO, DE_EN, tokenizer, encoder, json.dumps(PROMPTS))
    results = json.loads(done.stdout.split("RESULT ", 1)[1])

    first = ELFText2TextPipeline.from_pretrained(converted)  # the first user's calibrated folder, in this process
    first.set_progress_bar_config(disable=True)
    expected = first.scheduler.config.coefficients_by_steps
    first.scheduler = UntiedELFScheduler.from_config(first.scheduler.config)
    reference = first(prompt=PROMPTS, num_inference_steps=8, generator=torch.Generator().manual_seed(0)).texts
    bank_record = {"file": "sources.txt", "count": len(PROMPTS)}
    for name, result in results.items():
        assert result["scheduler"] == "UntiedELFScheduler", name
        assert result["coefficients"] == expected and result["coefficients"]["8"]["eta_t"] > 0, name
        assert {k: result["prompt_banks"]["8"][k] for k in bank_record} == bank_record, name
        assert len(result["texts"]) == len(PROMPTS), name
        assert result["texts"] == reference, name  # the same statistics and coefficients: the same samples
