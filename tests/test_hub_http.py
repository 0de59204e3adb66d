"""
Hub round trips over real HTTP: a local Hub-compatible server (`tests/hub_server.py`: olah serving git repos, plus
upload endpoints) on 127.0.0.1, with huggingface_hub pointed at it. Pipelines with sampler statistics are pushed and
loaded by repo id, at pinned revisions, through diffusers' remote-code path and through `untied-sc convert`; the
offline and unreachable cases give our messages. Any attempt to resolve a host other than loopback fails the test.
"""

import dataclasses
import json
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from untied_sc import (
    ELFPipeline,
    ELFScheduler,
    ELFTransformerModel,
    LangFlowPipeline,
    LangFlowScheduler,
    LangFlowTransformerModel,
)
from untied_sc.cli import main as cli_main
from untied_sc.pipelines import load_pipeline
from untied_sc.pipelines.remote_code import MODULE_NAME, MODULE_TEXT, is_package_component, package_components

from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_models import _write_official_elf_checkpoint, _write_official_langflow_folder
from .tiny import random_statistics, tiny_tokenizer, tiny_tokenizer_folder


LOOPBACK = {"127.0.0.1", "localhost", "::1"}
STATISTICS = "sampler_statistics/diffusion_pytorch_model.safetensors"
STEPS = 4


@pytest.fixture
def loopback_guard(monkeypatch):
    """Records (and refuses) every name resolution of a non-loopback host made during a test."""
    real, attempts = socket.getaddrinfo, []

    def guarded(host, *args, **kwargs):
        if host not in LOOPBACK:
            attempts.append(host)
            raise OSError(f"the Hub tests talk to 127.0.0.1 only, not {host!r}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield
    assert not attempts, f"a test tried to reach {attempts}"


@pytest.fixture(autouse=True)
def loopback_only(loopback_guard):
    """Every test of this module talks to the local Hub only (a module importing `loopback_guard` instead guards the
    tests that ask for it)."""


def point_hub_at(monkeypatch, endpoint: str) -> None:
    """
    Makes huggingface_hub talk to `endpoint`. It reads `HF_ENDPOINT` once, at import, into `constants.ENDPOINT` (and
    the resolve-URL template); the module-level client behind `create_repo`, `model_info`, `upload_folder` (which
    diffusers imports) was built then too. The variable is set as well, for code that reads it late.
    """
    from huggingface_hub import constants, hf_api

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)


@pytest.fixture
def hub(local_hub, tmp_path, monkeypatch):  # noqa: F811
    """The local Hub as huggingface_hub's endpoint, online, with an empty per-test cache."""
    from huggingface_hub import constants

    point_hub_at(monkeypatch, local_hub.endpoint)
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # a proxy configured on the machine stays out of it
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")  # never a real token, and the server ignores it
    return dataclasses.replace(local_hub, cache=cache)


@pytest.fixture
def make_pipe(tiny_elf, tiny_langflow):
    """A tiny pipeline of `family` with sampler statistics for STEPS (their moments drawn from `seed`)."""

    def make(family: str, seed: int = 0):
        if family == "elf":
            pipe = ELFPipeline(tiny_elf, ELFScheduler(), tiny_tokenizer())
        else:
            pipe = LangFlowPipeline(tiny_langflow, LangFlowScheduler(), tiny_tokenizer())
        statistics = random_statistics(pipe.transformer, family, steps=(STEPS,), seed=seed)
        pipe.register_modules(sampler_statistics=statistics)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    return make


def saved(pipe, folder):
    pipe.save_pretrained(folder)
    return folder


def sample(pipe) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)
    return pipe(batch_size=2, num_inference_steps=STEPS, generator=generator, output_type="seq").sequences


def statistics_of(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / STATISTICS)


def assert_same_statistics(pipe, expected: dict[str, torch.Tensor]) -> None:
    loaded = pipe.sampler_statistics.state_dict()
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


# --- downloads ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_from_pretrained_by_repo_id_downloads_the_pipeline_with_its_statistics(hub, make_pipe, tmp_path, family):
    pipe = make_pipe(family)
    folder = saved(pipe, tmp_path / "pipe")
    commit = hub.commit(f"org/{family}-tiny", folder)
    cls = type(pipe)
    loaded = cls.from_pretrained(f"org/{family}-tiny")
    assert type(loaded) is cls
    assert_same_statistics(loaded, statistics_of(folder))
    assert torch.equal(sample(loaded), sample(pipe))
    snapshot = hub.cache / f"models--org--{family}-tiny" / "snapshots" / commit
    assert (snapshot / STATISTICS).read_bytes() == (folder / STATISTICS).read_bytes()
    assert (hub.cache / f"models--org--{family}-tiny" / "refs" / "main").read_text() == commit


def test_revision_pinning_loads_the_old_commit_by_tag_branch_and_hash(hub, make_pipe, tmp_path):
    old = saved(make_pipe("langflow", seed=1), tmp_path / "old")
    new = saved(make_pipe("langflow", seed=2), tmp_path / "new")
    assert not torch.equal(statistics_of(old)["rms_nfe4"], statistics_of(new)["rms_nfe4"])
    old_commit = hub.commit("org/pinned", old, "statistics from seed 1")
    hub.tag("org/pinned", "v1")
    hub.branch("org/pinned", "first-calibration")
    new_commit = hub.commit("org/pinned", new, "statistics from seed 2")
    assert_same_statistics(LangFlowPipeline.from_pretrained("org/pinned"), statistics_of(new))
    for revision in ("v1", "first-calibration", old_commit):
        assert_same_statistics(LangFlowPipeline.from_pretrained("org/pinned", revision=revision), statistics_of(old))
    assert_same_statistics(load_pipeline("org/pinned", revision="v1"), statistics_of(old))
    snapshots = hub.cache / "models--org--pinned" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == sorted([old_commit, new_commit])
    assert (hub.cache / "models--org--pinned" / "refs" / "v1").read_text() == old_commit


def test_snapshot_download_fetches_the_files_byte_for_byte(hub, make_pipe, tmp_path):
    from huggingface_hub import HfApi, snapshot_download

    from untied_sc.hub import resolve_local

    folder = saved(make_pipe("elf"), tmp_path / "pipe")
    commit = hub.commit("org/files", folder)
    assert HfApi().repo_info("org/files").sha == commit
    downloaded = snapshot_download("org/files")
    expected = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(downloaded)) for p in Path(downloaded).rglob("*") if p.is_file()) == [
        ".gitattributes",
        *expected,
    ]
    for name in expected:
        assert (Path(downloaded) / name).read_bytes() == (folder / name).read_bytes(), name
    only_statistics = resolve_local("org/files", ["sampler_statistics/*"], cache_dir=tmp_path / "other-cache")
    assert sorted(p.name for p in only_statistics.rglob("*") if p.is_file()) == sorted(
        p.name for p in (folder / "sampler_statistics").iterdir()
    )


def test_diffusion_pipeline_loads_a_repo_with_trust_remote_code(hub, make_pipe, tmp_path):
    from diffusers import DiffusionPipeline

    pipe = make_pipe("langflow")
    folder = saved(pipe, tmp_path / "pipe")
    assert (folder / f"{MODULE_NAME}.py").read_text() == MODULE_TEXT
    hub.commit("org/remote-code", folder)
    generic = DiffusionPipeline.from_pretrained("org/remote-code", trust_remote_code=True)
    assert type(generic) is LangFlowPipeline
    assert_same_statistics(generic, statistics_of(folder))
    assert torch.equal(sample(generic), sample(pipe))


def test_custom_pipeline_code_is_served_from_the_repo_and_needs_trust(hub, make_pipe, tmp_path):
    from diffusers import DiffusionPipeline

    pipe = make_pipe("langflow")
    folder = saved(pipe, tmp_path / "pipe")
    module = folder / f"{MODULE_NAME}.py"
    module.write_text(
        MODULE_TEXT + "\n\nclass ServedLangFlowPipeline(LangFlowPipeline):\n    SERVED = 'from the repo'\n"
    )
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = [MODULE_NAME, "ServedLangFlowPipeline"]
    (folder / "model_index.json").write_text(json.dumps(index))
    hub.commit("org/custom-code", folder)
    with pytest.raises(ValueError, match="trust_remote_code"):
        LangFlowPipeline.from_pretrained("org/custom-code")
    custom = DiffusionPipeline.from_pretrained("org/custom-code", trust_remote_code=True)
    assert type(custom).__name__ == "ServedLangFlowPipeline" and custom.SERVED == "from the repo"
    assert isinstance(custom, LangFlowPipeline)
    assert torch.equal(sample(custom), sample(pipe))


def test_a_changed_component_module_file_is_not_trusted_silently(hub, make_pipe, tmp_path):
    folder = saved(make_pipe("langflow"), tmp_path / "pipe")
    index = json.loads((folder / "model_index.json").read_text())
    module = folder / "scheduler" / f"{index['scheduler'][0]}.py"
    assert module.is_file()  # written by save_pretrained, for diffusers' repo-id check
    module.write_text(module.read_text() + "print('hello')\n")
    hub.commit("org/changed-component", folder)
    with pytest.raises(ValueError, match="trust_remote_code"):
        LangFlowPipeline.from_pretrained("org/changed-component")


@pytest.mark.parametrize("name", ["elf-small", "langflow-small"])
def test_the_bundled_pipelines_carry_the_module_files_a_repo_id_load_needs(name):
    folder = Path(__file__).parent.parent / "hub_artifacts" / name
    components = package_components(json.loads((folder / "model_index.json").read_text()))
    assert {"transformer", "scheduler", "sampler_statistics"} <= set(components)
    for component, (module, class_name) in components.items():
        assert is_package_component(folder, component, module, class_name), component


def test_cli_convert_takes_a_hub_id(hub, tmp_path, capsys, elf_golden, langflow_golden):
    (tmp_path / "elf").mkdir()
    _write_official_elf_checkpoint(tmp_path / "elf" / "checkpoint_7", elf_golden.weights)
    (tmp_path / "elf" / "README.md").write_text("An official checkpoint.\n")
    elf_commit = hub.commit("org/elf-official", tmp_path / "elf")
    _write_official_langflow_folder(tmp_path / "langflow", langflow_golden)
    hub.commit("org/langflow-official", tmp_path / "langflow")
    out = tmp_path / "out"
    tokenizer = ["--tokenizer", tiny_tokenizer_folder(tmp_path / "tokenizer")]
    elf_args = ["--max-length", "12", "--sde-gamma", "1.5", "--sc-cfg-scale", "3", *tokenizer]
    assert cli_main(["convert", "elf", "org/elf-official", str(out / "elf"), *elf_args]) == 0
    assert cli_main(["convert", "langflow", "org/langflow-official", str(out / "langflow"), *tokenizer]) == 0
    assert "Wrote" in capsys.readouterr().out
    elf = ELFTransformerModel.from_pretrained(out / "elf", subfolder="transformer")
    assert torch.equal(elf.unembed_bias, elf_golden.weights["unembed_bias"])
    card = (out / "elf" / "README.md").read_text()
    assert "org/elf-official" in card and elf_commit in card  # the commit read
    langflow = LangFlowTransformerModel.from_pretrained(out / "langflow", subfolder="transformer")
    assert torch.equal(langflow.proposal.scale, langflow_golden.weights["proposal.scale"])
    snapshot = next((hub.cache / "models--org--elf-official" / "snapshots").iterdir())
    assert [p.name for p in snapshot.iterdir()] == ["checkpoint_7"]  # only what the converter asks for


# --- uploads --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_push_to_hub_then_from_pretrained_round_trips(hub, make_pipe, family):
    pipe = make_pipe(family)
    pipe.push_to_hub(f"org/pushed-{family}")
    files = hub.files(f"org/pushed-{family}")
    assert STATISTICS in files and f"{MODULE_NAME}.py" in files and "README.md" in files
    loaded = type(pipe).from_pretrained(f"org/pushed-{family}")
    assert_same_statistics(loaded, pipe.sampler_statistics.state_dict())
    assert torch.equal(sample(loaded), sample(pipe))


def test_cli_calibrate_from_the_hub_to_the_hub(hub, make_pipe, tmp_path, capsys):
    pipe = make_pipe("langflow")
    pipe.register_modules(sampler_statistics=None)
    hub.commit("org/uncalibrated", saved(pipe, tmp_path / "pipe"))
    local = tmp_path / "calibrated"
    args = ["calibrate", "org/uncalibrated", "--output", str(local), "--nfe", str(STEPS), "--bank-size", "2"]
    assert cli_main([*args, "--batch-size", "2", "--no-progress", "--push-to-hub", "org/calibrated"]) == 0
    assert "Pushed to org/calibrated" in capsys.readouterr().out
    loaded = LangFlowPipeline.from_pretrained("org/calibrated")
    assert loaded.sampler_statistics.config.calibrated_steps == [STEPS]
    assert_same_statistics(loaded, statistics_of(local))


# --- no network -----------------------------------------------------------------------------------------------


def test_offline_mode_with_an_empty_cache_says_so(hub, monkeypatch, make_pipe, tmp_path):
    hub.commit("org/offline", saved(make_pipe("elf"), tmp_path / "pipe"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        FileNotFoundError, match=r"'org/offline'.*: HF_HUB_OFFLINE is set, and revision 'main' of it is not"
    ):
        ELFPipeline.from_pretrained("org/offline")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    ELFPipeline.from_pretrained("org/offline")  # online, it downloads ...
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert torch.equal(sample(ELFPipeline.from_pretrained("org/offline")), sample(make_pipe("elf")))  # ... then cached


def test_a_hub_that_is_down_gives_our_message_and_the_cache_still_serves(hub, monkeypatch, make_pipe, tmp_path):
    hub.commit("org/down", saved(make_pipe("langflow"), tmp_path / "pipe"))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: connections are refused
        point_hub_at(monkeypatch, down)
        with pytest.raises(
            FileNotFoundError, match=rf"'org/down' from the Hugging Face Hub at {down}: it could not be reached"
        ):
            LangFlowPipeline.from_pretrained("org/down")
        point_hub_at(monkeypatch, hub.endpoint)
        LangFlowPipeline.from_pretrained("org/down")
        point_hub_at(monkeypatch, down)
        assert_same_statistics(LangFlowPipeline.from_pretrained("org/down"), statistics_of(tmp_path / "pipe"))


def test_an_unknown_repo_or_revision_is_named(hub, make_pipe, tmp_path):
    hub.commit("org/known", saved(make_pipe("elf"), tmp_path / "pipe"))
    with pytest.raises(
        FileNotFoundError, match=rf"'org/unknown' from the Hugging Face Hub at {hub.endpoint}: no such repo"
    ):
        ELFPipeline.from_pretrained("org/unknown")
    with pytest.raises(FileNotFoundError, match=r"'org/known' .*: the repo has no revision 'v9'"):
        ELFPipeline.from_pretrained("org/known", revision="v9")
