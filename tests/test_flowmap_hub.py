"""The flow-map family's Hub path over real HTTP against the local Hub (`tests/hub_server.py`), in fresh processes
that patch nothing: the local Hub serves `wonjKim/self-conditioned-fmlm` laid out as the released repo is (the
Lightning `.ckpt` files of the three stages, pickled hyper-parameters, no config.yml, a model card), with the
recorded tiny official weights as the EMA. The first user converts FMLM* by repo id (`untied-sc convert flowmap`),
samples, and uploads the pipeline folder with the library's push; the second, with an empty cache, loads it by repo id
(`FlowMapPipeline.from_pretrained` and `load_pipeline`) and samples the same tokens.

The released repo's recorded length applies (1024, `train_owt_*.yml`): the network has no learned positions (RoPE),
so the tiny weights run at it as they do at the recorded 8.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from untied_sc import FlowMapPipeline, load_official_flowmap
from untied_sc.schedulers.scheduling_flowmap import FlowMapLMScheduler

from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_flowmap_pipeline import lightning_checkpoint
from .test_hub_http import hub, loopback_guard  # noqa: F401  (fixtures)


ROOT = Path(__file__).resolve().parents[1]
FMLM = "wonjKim/self-conditioned-fmlm"
PIPELINE_REPO = "someone/fmlm-star-untied-sc"
SAMPLE = "num_inference_steps=2, batch_size=2, generator=torch.Generator().manual_seed(42), output_type='seq'"

# The first user: sample the converted folder, then push it as it is (the library's upload).
PUSH = f"""
import json, sys, torch
from untied_sc import FlowMapPipeline
from untied_sc.hub import upload_folder_to_hub

folder, repo = sys.argv[1:3]
pipe = FlowMapPipeline.from_pretrained(folder)
pipe.set_progress_bar_config(disable=True)
ids = pipe({SAMPLE}).sequences
commit = upload_folder_to_hub(folder, repo, commit_message="FMLM* as a FlowMapPipeline")
print("RESULT " + json.dumps({{"ids": ids.tolist(), "commit": commit}}))
"""

# The second user: load the pipeline by repo id, with the class and with `load_pipeline`.
LOAD = f"""
import json, sys, torch
from untied_sc import FlowMapPipeline
from untied_sc.pipelines.loading import load_pipeline

repo = sys.argv[1]
results = {{}}
for name, load in (("from_pretrained", FlowMapPipeline.from_pretrained), ("load_pipeline", load_pipeline)):
    pipe = load(repo)
    pipe.set_progress_bar_config(disable=True)
    results[name] = {{"ids": pipe({SAMPLE}).sequences.tolist(), "class": type(pipe).__name__,
                     "scheduler": type(pipe.scheduler).__name__, "max_length": pipe.transformer.config.max_length}}
print("RESULT " + json.dumps(results))
"""


def released_repo(folder: Path) -> Path:
    """`wonjKim/self-conditioned-fmlm`'s layout: `elf.ckpt`, `elf_star.ckpt`, `fmlm_star.ckpt` (Lightning, with EMA
    and pickled hyper-parameters) and a model card; nothing that records a length or a sampling regime."""
    folder.mkdir(parents=True)
    for name in ("fmlm_star", "elf_star", "elf_teacher"):
        path = folder / ("elf.ckpt" if name == "elf_teacher" else f"{name}.ckpt")
        lightning_checkpoint(path, name=name, pickled=True, config=False)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# Self-conditioned FMLM, a tiny stand-in\n")
    return folder


def _run(env: dict, cwd: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _result(done: subprocess.CompletedProcess):
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def test_convert_by_repo_id_push_the_pipeline_then_load_it_by_repo_id_and_sample_the_same_tokens(
    hub,  # noqa: F811
    loopback_guard,  # noqa: F811
    tmp_path,
    one_thread,
):
    official = released_repo(tmp_path / "fmlm-repo")
    official_commit = hub.commit(FMLM, official, "the official checkpoints")
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
        "OMP_NUM_THREADS": "1",
    }
    first_user, second_user = tmp_path / "first-user", tmp_path / "second-user"
    first_user.mkdir(), second_user.mkdir()

    # The first user: convert by repo id (the released repo's settings: length 1024, FMLM* self-conditioning-free).
    convert = [*cli, "convert", "flowmap", FMLM, "fmlm-star", "--variant", "fmlm-star"]
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert f"untied-sc {' '.join(convert[-6:])} --allow-pickle\n" in usage  # the guide's command, as run here
    refused = subprocess.run(convert, cwd=first_user, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "allow_pickle" in refused.stderr  # Lightning pickles: only when allowed
    assert not (first_user / "fmlm-star").exists()
    done = _run(env, first_user, *convert, "--allow-pickle")
    assert "Wrote FlowMapPipeline" in done.stdout and "FlowMapLMScheduler" in done.stdout
    converted = first_user / "fmlm-star"
    assert json.loads((converted / "model_index.json").read_text())["_class_name"] == "FlowMapPipeline"
    config = json.loads((converted / "transformer" / "config.json").read_text())
    assert (config["max_length"], config["const_phase"], config["two_time"]) == (1024, 0.002, True)
    scheduler = json.loads((converted / "scheduler" / "scheduler_config.json").read_text())
    assert (scheduler["sampler"], scheduler["self_conditioning"]) == ("ctm", "free")
    cached = [p.name for p in (tmp_path / "cache-first-user").iterdir() if p.name.startswith("models--")]
    snapshot = tmp_path / "cache-first-user" / "models--wonjKim--self-conditioned-fmlm" / "snapshots"
    assert cached == ["models--wonjKim--self-conditioned-fmlm"] and [p.name for p in snapshot.iterdir()] == [
        official_commit
    ]
    assert {p.name for p in (snapshot / official_commit).iterdir()} == {"fmlm_star.ckpt"}  # only the variant's file
    pushed = _result(_run(env, first_user, sys.executable, "-c", PUSH, str(converted), PIPELINE_REPO))
    files = set(hub.files(PIPELINE_REPO)) - {".gitattributes"}
    assert {"model_index.json", "transformer/config.json", "scheduler/scheduler_config.json"} <= files
    assert files == {str(p.relative_to(converted)) for p in converted.rglob("*") if p.is_file()}  # as it was written

    # The second user, with an empty cache: the pipeline by repo id, both ways, gives the first user's tokens.
    env = {**env, "HF_HOME": str(tmp_path / "hf-home-2"), "HF_HUB_CACHE": str(tmp_path / "cache-second-user")}
    loaded = _result(_run(env, second_user, sys.executable, "-c", LOAD, PIPELINE_REPO))
    for name, result in loaded.items():
        assert (result["class"], result["scheduler"], result["max_length"]) == (
            "FlowMapPipeline",
            "FlowMapLMScheduler",
            1024,
        ), name
        assert result["ids"] == pushed["ids"], name
    cached = {p.name for p in (tmp_path / "cache-second-user").iterdir() if p.name.startswith("models--")}
    assert cached == {f"models--{PIPELINE_REPO.replace('/', '--')}"}

    # And the tokens are those of the official checkpoint read here, at the released settings (an independent load).
    model = load_official_flowmap(
        official / "fmlm_star.ckpt", "fmlm-star", max_length=1024, self_conditioning="free", allow_pickle=True
    )
    pipe = FlowMapPipeline(model, FlowMapLMScheduler(self_conditioning="free"), sc_cfg_scale=5.0)
    pipe.set_progress_bar_config(disable=True)
    ids = pipe(num_inference_steps=2, batch_size=2, generator=torch.Generator().manual_seed(42), output_type="seq")
    assert ids.sequences.tolist() == pushed["ids"]
