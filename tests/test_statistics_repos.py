"""
Sampler statistics published on their own, over real HTTP against the local Hub (`tests/hub_server.py`): a statistics
repo holds `sampler_statistics/`, the per-NFE coefficients and tuning records, a record of the base weights and a
model card, and no weights; `from_pretrained(BASE, sampler_statistics=REPO)` loads the base with them and refuses
statistics of other weights, naming both. The whole path of two users runs in fresh processes: convert an official
checkpoint by repo id, calibrate, push the statistics only; then, with an empty cache, convert again and load the
official weights with the published statistics.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from untied_sc import LangFlowPipeline, LangFlowScheduler, LangFlowTransformerModel, UntiedSelfConditioningScheduler
from untied_sc.cli import main as cli_main
from untied_sc.hub import HubPushError
from untied_sc.pipelines import load_pipeline
from untied_sc.pipelines.statistics_repo import BASE_CHECKPOINT_FILE, BaseCheckpoint, HubSource
from untied_sc.schedulers.sampler_statistics import model_fingerprint

from .conftest import Golden
from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_hub_http import hub, loopback_guard, loopback_only, point_hub_at  # noqa: F401  (fixtures)
from .tiny import random_statistics, tiny_tokenizer, tiny_tokenizer_folder


ROOT = Path(__file__).resolve().parents[1]
OFFICIAL_ID = "Continuous-Rivals-Discrete/langflow-owt"  # a released id: the table's settings apply
STEPS = 4
COEFFICIENTS = {str(STEPS): {"eta_r": 0.5, "eta_t": 0.25, "eta_o": 1.5, "alpha": 0.7, "temperature": 0.9}}
TUNING = {str(STEPS): {"rule": "a record of the search", "budget": 20}}
STATISTICS_FILES = {"sampler_statistics/config.json", "sampler_statistics/diffusion_pytorch_model.safetensors"}
PUBLISHED = STATISTICS_FILES | {"coefficients.json", BASE_CHECKPOINT_FILE, "README.md"}


def langflow_model(seed: int) -> LangFlowTransformerModel:
    torch.manual_seed(seed)
    kwargs = {"cond_dim": 16, "num_layers": 2, "num_attention_heads": 4, "max_length": 12}
    model = LangFlowTransformerModel(vocab_size=40, hidden_size=32, **kwargs).eval()
    with torch.no_grad():  # initialised at zero, as the official code does: two seeds would be one fingerprint
        model.backbone.self_cond_proj.weight.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(seed))
    return model


def calibrated(pipe: LangFlowPipeline, seed: int = 0) -> LangFlowPipeline:
    """`pipe` with statistics for STEPS (drawn from `seed`) and tuned-looking coefficients in its scheduler config."""
    pipe.register_modules(
        sampler_statistics=random_statistics(pipe.transformer, "langflow", steps=(STEPS,), seed=seed)
    )
    pipe.scheduler.register_to_config(coefficients_by_steps=COEFFICIENTS, tuning_by_steps=TUNING)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def base_folder(folder: Path, seed: int) -> Path:
    """A LangFlow pipeline folder of weights drawn from `seed`, without statistics."""
    LangFlowPipeline(langflow_model(seed), LangFlowScheduler(), tiny_tokenizer()).save_pretrained(folder)
    return folder


def untied_texts(pipe: LangFlowPipeline, steps: int = STEPS) -> list[str]:
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    return pipe(batch_size=2, num_inference_steps=steps, generator=torch.Generator().manual_seed(0)).texts


# --- the whole path, in fresh processes ---------------------------------------------------------------------------


def _run(env: dict, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


LOAD_SCRIPT = """
import json, sys, torch
from untied_sc import LangFlowPipeline, UntiedSelfConditioningScheduler

base, stats, official, tokenizer = sys.argv[1:5]
results = {}
for name, pipe in (
    ("from_pretrained", LangFlowPipeline.from_pretrained(base, sampler_statistics=stats)),
    ("from_official", LangFlowPipeline.from_official(official, tokenizer=tokenizer, sampler_statistics=stats)),
):
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    out = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(0))
    results[name] = {"texts": out.texts, "scheduler": type(pipe.scheduler).__name__,
                     "coefficients": pipe.scheduler.config.coefficients_by_steps,
                     "calibrated": pipe.sampler_statistics.config.calibrated_steps}
print("RESULT " + json.dumps(results))
"""


def test_convert_calibrate_push_statistics_then_load_the_official_weights_with_them(hub, tmp_path):  # noqa: F811
    golden = Golden("langflow_sample_nfe8.safetensors")
    official = tmp_path / "official"
    official.mkdir()
    (official / "config.json").write_text(json.dumps({"model_type": "LangFlow", **golden.config}))
    save_file(golden.weights, official / "model.safetensors")
    official_commit = hub.commit(OFFICIAL_ID, official, "the official weights")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
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
    cli = ["-m", "untied_sc.cli"]

    # The first user: convert by repo id, calibrate, push the statistics only.
    converted = tmp_path / "langflow-owt"
    _run(env, *cli, "convert", "langflow", OFFICIAL_ID, str(converted), "--tokenizer", tokenizer)
    recorded = json.loads((converted / "converted_from.json").read_text())
    assert (recorded["repo_id"], recorded["commit"]) == (OFFICIAL_ID, official_commit)
    calibrate = ["calibrate", str(converted), "--nfe", "8", "--bank-size", "4", "--batch-size", "4", "--no-progress"]
    pushed = _run(env, *cli, *calibrate, "--push-statistics-to", "someone/langflow-owt-untied-sc")
    assert "Pushed the sampler statistics and coefficients to someone/langflow-owt-untied-sc" in pushed.stdout
    files = set(hub.files("someone/langflow-owt-untied-sc")) - {".gitattributes"}
    assert files == PUBLISHED  # no weights, no tokenizer
    record = BaseCheckpoint.from_json((Path(f"{converted}-statistics") / BASE_CHECKPOINT_FILE).read_text())
    assert record.official == HubSource(OFFICIAL_ID, None, official_commit) and record.pipeline is None
    card = (Path(f"{converted}-statistics") / "README.md").read_text()
    assert f"untied-sc convert langflow {OFFICIAL_ID} BASE_DIR --revision {official_commit}" in card
    assert 'sampler_statistics="someone/langflow-owt-untied-sc"' in card

    # The second user, with an empty cache: convert the official weights, load them with the published statistics.
    env["HF_HUB_CACHE"] = str(tmp_path / "cache-second-user")
    mine = tmp_path / "second-user" / "langflow-owt"
    _run(env, *cli, "convert", "langflow", OFFICIAL_ID, str(mine), "--tokenizer", tokenizer)
    assert not (mine / "sampler_statistics").exists()
    done = _run(env, "-c", LOAD_SCRIPT, str(mine), "someone/langflow-owt-untied-sc", OFFICIAL_ID, tokenizer)
    results = json.loads(done.stdout.split("RESULT ", 1)[1])
    first = LangFlowPipeline.from_pretrained(converted)  # the first user's calibrated folder, in this process
    expected = first.scheduler.config.coefficients_by_steps
    reference = untied_texts(first, steps=8)
    for name, result in results.items():
        assert result["scheduler"] == "UntiedLangFlowScheduler", name
        assert result["calibrated"] == [8] and result["coefficients"] == expected, name
        assert len(result["texts"]) == 2 and all(isinstance(text, str) for text in result["texts"]), name
        assert result["texts"] == reference, name  # the same statistics and coefficients: the same samples


# --- in process ---------------------------------------------------------------------------------------------------


def test_statistics_folder_round_trip_installs_statistics_coefficients_and_tuning(tmp_path):
    base = base_folder(tmp_path / "base", seed=0)
    pipe = calibrated(LangFlowPipeline.from_pretrained(base))
    written = pipe.save_sampler_statistics(tmp_path / "stats")
    assert {p.relative_to(written).as_posix() for p in written.rglob("*") if p.is_file()} == PUBLISHED
    assert json.loads((written / "coefficients.json").read_text()) == {
        "coefficients_by_steps": COEFFICIENTS,
        "tuning_by_steps": TUNING,
    }
    record = BaseCheckpoint.from_json((written / BASE_CHECKPOINT_FILE).read_text())
    assert (
        record.model_fingerprint == model_fingerprint(pipe.transformer) and record.pipeline_class == "LangFlowPipeline"
    )
    assert BaseCheckpoint.from_json(record.to_json()) == record
    with pytest.raises(FileExistsError, match="not empty"):
        pipe.save_sampler_statistics(written)

    loaded = LangFlowPipeline.from_pretrained(base, sampler_statistics=tmp_path / "stats")
    assert loaded.scheduler.config.coefficients_by_steps == COEFFICIENTS
    assert loaded.scheduler.config.tuning_by_steps == TUNING
    for name, tensor in pipe.sampler_statistics.state_dict().items():
        assert torch.equal(loaded.sampler_statistics.state_dict()[name], tensor), name
    assert untied_texts(loaded) == untied_texts(pipe)
    assert load_pipeline(base, sampler_statistics=str(tmp_path / "stats")).scheduler.config.coefficients_by_steps
    # a calibrated pipeline folder is a statistics source too; a SamplerStatistics object works as before
    pipe.save_pretrained(tmp_path / "calibrated")
    from_folder = LangFlowPipeline.from_pretrained(base, sampler_statistics=tmp_path / "calibrated")
    assert untied_texts(from_folder) == untied_texts(pipe)
    as_object = LangFlowPipeline.from_pretrained(base, sampler_statistics=pipe.sampler_statistics)
    assert as_object.sampler_statistics is pipe.sampler_statistics


def test_statistics_of_another_model_are_refused_naming_both_repos(hub, tmp_path):  # noqa: F811
    hub.commit("org/model-a", base_folder(tmp_path / "a", seed=0))
    hub.commit("org/model-b", base_folder(tmp_path / "b", seed=1))
    a = calibrated(LangFlowPipeline.from_pretrained("org/model-a"))
    a.push_sampler_statistics("org/model-a-statistics")
    with pytest.raises(ValueError) as refused:
        LangFlowPipeline.from_pretrained("org/model-b", sampler_statistics="org/model-a-statistics")
    message = str(refused.value)
    assert "'org/model-a-statistics'" in message and "'org/model-b'" in message  # both repos
    assert "computed for the pipeline 'org/model-a' at commit" in message  # what they record
    assert model_fingerprint(a.transformer) in message and "from_pretrained('org/model-a'" in message
    assert message.count("\n") == 0
    b = LangFlowPipeline.from_pretrained("org/model-b")
    b.sampler_statistics = None
    with pytest.raises(ValueError, match="no sampler statistics"):
        b.save_sampler_statistics(tmp_path / "nothing")


def test_a_statistics_repo_for_another_revision_of_the_base(hub, tmp_path):  # noqa: F811
    base_v1 = hub.commit("org/base", base_folder(tmp_path / "v1", seed=0), "first weights")
    hub.tag("org/base", "v1")
    hub.commit("org/base", base_folder(tmp_path / "v2", seed=1), "retrained")
    old = calibrated(LangFlowPipeline.from_pretrained("org/base", revision="v1"), seed=0)
    stats_old = old.push_sampler_statistics("org/base-statistics")
    hub.tag("org/base-statistics", "for-v1")
    new = calibrated(LangFlowPipeline.from_pretrained("org/base"), seed=1)
    new.push_sampler_statistics("org/base-statistics")
    record = json.loads(hub_file(hub, "org/base-statistics", BASE_CHECKPOINT_FILE, "for-v1"))
    assert record["pipeline"] == {"repo_id": "org/base", "revision": "v1", "commit": base_v1}
    assert len(stats_old) == 40

    # main with main, v1 with the statistics' tag: each base gets its own statistics
    assert untied_texts(LangFlowPipeline.from_pretrained("org/base", sampler_statistics="org/base-statistics")) == (
        untied_texts(new)
    )
    pinned = LangFlowPipeline.from_pretrained(
        "org/base", revision="v1", sampler_statistics="org/base-statistics", sampler_statistics_revision="for-v1"
    )
    assert untied_texts(pinned) == untied_texts(old)
    # the current base with the statistics of v1: refused, naming the revision they record and the one loaded
    with pytest.raises(ValueError) as refused:
        LangFlowPipeline.from_pretrained(
            "org/base", sampler_statistics="org/base-statistics", sampler_statistics_revision="for-v1"
        )
    message = str(refused.value)
    assert f"the pipeline 'org/base' at commit {base_v1[:12]} (revision 'v1')" in message  # recorded
    assert f"from_pretrained('org/base', revision={base_v1!r}" in message  # the way out
    assert "statistics repo 'org/base-statistics' at commit" in message and "(revision 'for-v1')" in message
    assert "the base loaded is the pipeline 'org/base' at commit" in message
    with pytest.raises(FileNotFoundError, match="no revision 'v9'"):
        LangFlowPipeline.from_pretrained(
            "org/base", sampler_statistics="org/base-statistics", sampler_statistics_revision="v9"
        )
    with pytest.raises(TypeError, match="sampler_statistics_revision"):
        LangFlowPipeline.from_pretrained("org/base", sampler_statistics_revision="for-v1")


def hub_file(local, repo_id: str, path: str, revision: str) -> str:
    from .hub_server import _git, repo_folder

    return _git(repo_folder(local.root, repo_id), "show", f"{revision}:{path}")


def closed_endpoint() -> tuple[socket.socket, str]:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    return closed, f"http://127.0.0.1:{closed.getsockname()[1]}"


def test_a_hub_that_is_down_on_push_keeps_the_folder_and_on_load_says_so(hub, monkeypatch, tmp_path, capsys):  # noqa: F811
    base = base_folder(tmp_path / "base", seed=0)
    pipe = calibrated(LangFlowPipeline.from_pretrained(base))
    closed, down = closed_endpoint()
    with closed:
        point_hub_at(monkeypatch, down)
        kept = tmp_path / "kept"
        with pytest.raises(HubPushError, match=rf"'org/stats' on the Hub at {down}.*kept in {kept}.*hf upload"):
            pipe.push_sampler_statistics("org/stats", save_directory=kept)
        assert {p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()} == PUBLISHED
        with pytest.raises(HubPushError) as unsaved:  # a temporary folder is kept too, and named
            pipe.push_sampler_statistics("org/stats")
        assert (Path(str(unsaved.value).split("kept in ", 1)[1].split(";")[0]) / BASE_CHECKPOINT_FILE).is_file()

        args = ["calibrate", str(base), "--nfe", str(STEPS), "--bank-size", "2", "--batch-size", "2", "--no-progress"]
        assert cli_main([*args, "--push-statistics-to", "org/stats"]) == 2
        error = capsys.readouterr().err
        assert "Could not push to 'org/stats'" in error and f"kept in {base}-statistics" in error
        assert (base / "sampler_statistics" / "config.json").is_file()  # the calibrated folder is written
        assert (Path(f"{base}-statistics") / "sampler_statistics" / "config.json").is_file()
        assert cli_main([*args, "--overwrite", "--push-statistics-to", "org/stats"]) == 2  # replaced with it

        with pytest.raises(FileNotFoundError) as unreachable:
            LangFlowPipeline.from_pretrained(base, sampler_statistics="org/stats")
        message = str(unreachable.value)
        assert message.startswith("The sampler statistics 'org/stats' could not be read: ")
        assert f"the Hugging Face Hub at {down}: it could not be reached" in message


def test_the_statistics_dir_is_checked_before_any_work(tmp_path, capsys):
    base = base_folder(tmp_path / "base", seed=0)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "file").write_text("something")
    args = ["calibrate", str(base), "--nfe", str(STEPS), "--bank-size", "2", "--no-progress"]
    assert cli_main([*args, "--push-statistics-to", "org/s", "--statistics-dir", str(occupied)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert not (base / "sampler_statistics").exists()
    assert cli_main([*args, "--statistics-dir", str(tmp_path / "s")]) == 2
    assert "give --push-statistics-to" in capsys.readouterr().err


def test_cli_push_statistics_uploads_a_calibrated_folder_without_its_weights(hub, tmp_path, capsys):  # noqa: F811
    pipe = calibrated(LangFlowPipeline.from_pretrained(base_folder(tmp_path / "base", seed=0)))
    pipe.save_pretrained(tmp_path / "calibrated")
    assert cli_main(["push-statistics", str(tmp_path / "calibrated"), "org/pushed-statistics"]) == 0
    assert "Pushed the sampler statistics and coefficients to org/pushed-statistics" in capsys.readouterr().out
    assert set(hub.files("org/pushed-statistics")) - {".gitattributes"} == PUBLISHED
    assert (tmp_path / "calibrated-statistics" / BASE_CHECKPOINT_FILE).is_file()
    loaded = LangFlowPipeline.from_pretrained(tmp_path / "base", sampler_statistics="org/pushed-statistics")
    assert untied_texts(loaded) == untied_texts(pipe)
    assert cli_main(["push-statistics", str(tmp_path / "base"), "org/none"]) == 2
    assert "has no sampler statistics to push" in capsys.readouterr().err


def test_a_copy_of_a_converted_folder_keeps_its_official_source(tmp_path):
    base = base_folder(tmp_path / "base", seed=0)
    source = {"given": OFFICIAL_ID, "repo_id": OFFICIAL_ID, "revision": "main", "commit": "c" * 40}
    (base / "converted_from.json").write_text(json.dumps(source))
    pipe = calibrated(LangFlowPipeline.from_pretrained(base))
    assert pipe.origin.official == HubSource(OFFICIAL_ID, "main", "c" * 40) and pipe.origin.pipeline is None
    pipe.save_pretrained(tmp_path / "copy")
    copy = calibrated(LangFlowPipeline.from_pretrained(tmp_path / "copy"))
    record = BaseCheckpoint.from_json(
        (copy.save_sampler_statistics(tmp_path / "s") / BASE_CHECKPOINT_FILE).read_text()
    )
    assert record.official == HubSource(OFFICIAL_ID, "main", "c" * 40)
    assert f"--revision {'c' * 40}" in (tmp_path / "s" / "README.md").read_text()


def _converted_from_the_hub(hub, tmp_path: Path) -> tuple[Path, str]:  # noqa: F811
    """The tiny official LangFlow folder on the local Hub under its released id, converted by repo id."""
    golden = Golden("langflow_sample_nfe8.safetensors")
    official = tmp_path / "official"
    official.mkdir()
    (official / "config.json").write_text(json.dumps({"model_type": "LangFlow", **golden.config}))
    save_file(golden.weights, official / "model.safetensors")
    commit = hub.commit(OFFICIAL_ID, official, "the official weights")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    assert cli_main(["convert", "langflow", OFFICIAL_ID, str(tmp_path / "converted"), "--tokenizer", tokenizer]) == 0
    return tmp_path / "converted", commit


def _set_max_length(folder: Path, value: int) -> None:
    config_path = folder / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["max_length"] = value
    config_path.write_text(json.dumps(config))


def test_a_copy_of_a_converted_folder_keeps_the_conversions_length_record(hub, tmp_path):  # noqa: F811
    import shutil

    converted, commit = _converted_from_the_hub(hub, tmp_path)
    recorded = json.loads((converted / "converted_from.json").read_text())
    length = Golden("langflow_sample_nfe8.safetensors").config["model_length"]
    assert (recorded["repo_id"], recorded["commit"], recorded["max_length"]) == (OFFICIAL_ID, commit, length)
    copied = Path(shutil.copytree(converted, tmp_path / "copied"))
    saved = tmp_path / "saved"
    LangFlowPipeline.from_pretrained(converted).save_pretrained(saved)
    for copy in (copied, saved):
        assert json.loads((copy / "converted_from.json").read_text()) == recorded, copy  # length, file, source, commit
        pipe = LangFlowPipeline.from_pretrained(copy)
        assert pipe.transformer.config.max_length == length
        assert pipe.origin.official == HubSource(OFFICIAL_ID, None, commit)
        assert pipe.origin.conversion.max_length == length
        _set_max_length(copy, 2 * length)  # a network built at another length: refused, naming the record
        with pytest.raises(ValueError, match=rf"max_length = {2 * length}, but .*converted_from.json records"):
            LangFlowPipeline.from_pretrained(copy)
    assert not (saved / "loaded_from.json").exists()  # loaded from a local folder: no pipeline repo to name
    # other weights saved over the folder take their records' place: none here (built in memory)
    _set_max_length(saved, length)
    other = LangFlowPipeline.from_pretrained(saved)
    other.origin = None
    other.save_pretrained(saved)
    assert not (saved / "converted_from.json").exists() and not (saved / "loaded_from.json").exists()


def test_a_pipeline_read_from_a_hub_repo_and_saved_elsewhere_records_the_repo(hub, tmp_path):  # noqa: F811
    converted, official_commit = _converted_from_the_hub(hub, tmp_path)
    pipeline_commit = hub.commit("org/langflow-owt-pipeline", converted, "the converted pipeline")
    hub.tag("org/langflow-owt-pipeline", "v1")
    saved = tmp_path / "saved"
    LangFlowPipeline.from_pretrained("org/langflow-owt-pipeline", revision="v1").save_pretrained(saved)
    assert json.loads((saved / "loaded_from.json").read_text()) == {
        "repo_id": "org/langflow-owt-pipeline",
        "revision": "v1",
        "commit": pipeline_commit,
    }
    assert json.loads((saved / "converted_from.json").read_text()) == json.loads(
        (converted / "converted_from.json").read_text()
    )
    pipe = calibrated(LangFlowPipeline.from_pretrained(saved))
    assert pipe.origin.pipeline == HubSource("org/langflow-owt-pipeline", "v1", pipeline_commit)
    assert pipe.origin.official == HubSource(OFFICIAL_ID, None, official_commit)
    published = pipe.save_sampler_statistics(tmp_path / "statistics", repo_id="someone/statistics")
    record = BaseCheckpoint.from_json((published / BASE_CHECKPOINT_FILE).read_text())
    assert record.pipeline == HubSource("org/langflow-owt-pipeline", "v1", pipeline_commit)
    assert record.official == HubSource(OFFICIAL_ID, None, official_commit)
    card = (published / "README.md").read_text()
    assert f'from_pretrained("org/langflow-owt-pipeline", revision="{pipeline_commit}"' in card
    # saved again from the copy, the record stays; loaded by repo id again, the snapshot names the repo itself
    pipe.save_pretrained(tmp_path / "saved-again")
    assert (tmp_path / "saved-again" / "loaded_from.json").read_text() == (saved / "loaded_from.json").read_text()
    assert LangFlowPipeline.from_pretrained("org/langflow-owt-pipeline").origin.pipeline == HubSource(
        "org/langflow-owt-pipeline", None, pipeline_commit
    )


def test_a_hub_that_cannot_be_reached_stops_convert_calibrate_and_push_naming_the_repo(
    hub,  # noqa: F811
    monkeypatch,
    tmp_path,
    capsys,
):
    """Convert and calibrate of a repo id, and push-statistics, with the Hub down: one message naming the repo, the
    endpoint and the fix; nothing written (push: the statistics folder kept, and named)."""
    pipe = calibrated(LangFlowPipeline.from_pretrained(base_folder(tmp_path / "base", seed=0)))
    pipe.save_pretrained(tmp_path / "calibrated")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    closed, down = closed_endpoint()
    with closed:
        point_hub_at(monkeypatch, down)
        tokenizer = ["--tokenizer", tiny_tokenizer_folder(tmp_path / "tokenizer")]
        assert cli_main(["convert", "langflow", OFFICIAL_ID, "out", *tokenizer]) == 2
        error = capsys.readouterr().err
        assert f"Could not fetch {OFFICIAL_ID!r} from the Hugging Face Hub at {down}: it could not be reached" in error
        assert "Check the network (and HF_ENDPOINT)" in error and error.count("error:") == 1  # one message

        args = ["calibrate", "org/pipeline", "--output", "calibrated", "--nfe", str(STEPS), "--bank-size", "2"]
        assert cli_main([*args, "--no-progress"]) == 2
        error = capsys.readouterr().err
        assert f"Could not fetch 'org/pipeline' from the Hugging Face Hub at {down}: it could not be reached" in error
        assert list(work.iterdir()) == []  # no folder, no staging folder

        assert cli_main(["push-statistics", str(tmp_path / "calibrated"), "org/stats"]) == 2
        error = capsys.readouterr().err
        kept = tmp_path / "calibrated-statistics"
        assert f"Could not push to 'org/stats' on the Hub at {down}" in error
        assert f"kept in {kept}" in error and f"hf upload org/stats {kept}" in error
        assert {p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()} == PUBLISHED
