"""Damaged artifacts, bad configs and wrong inputs fail with an error that names the file, the field and the fix."""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.tiny import random_statistics, tiny_tokenizer
from untied_sc import (
    ELFPipeline,
    ELFScheduler,
    ELFTransformerModel,
    LangFlowPipeline,
    LangFlowScheduler,
    LangFlowTransformerModel,
    UntiedLangFlowScheduler,
    UntiedSelfConditioningScheduler,
)
from untied_sc.pipelines import load_pipeline
from untied_sc.pipelines.artifact_checks import safetensors_tensor_names
from untied_sc.schedulers.config_checks import nearest_key


STATISTICS_FILE = "sampler_statistics/diffusion_pytorch_model.safetensors"


@pytest.fixture
def langflow_pipe(tiny_langflow):
    scheduler = UntiedLangFlowScheduler(eta_r=1.0, eta_t=1.0, eta_o=1.0, alpha=0.9)
    statistics = random_statistics(tiny_langflow, "langflow", steps=(4, 8))
    return LangFlowPipeline(tiny_langflow, scheduler, tiny_tokenizer(), statistics)


@pytest.fixture
def saved(langflow_pipe, tmp_path):
    folder = tmp_path / "pipe"
    langflow_pipe.save_pretrained(folder)
    return folder


def sample(pipe, **kwargs):
    kwargs = {"batch_size": 2, "num_inference_steps": 4, "generator": torch.Generator().manual_seed(0), **kwargs}
    return pipe(output_type="seq", **kwargs).sequences


def edit_tensors(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def edit_json(path, edit):
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def test_an_intact_folder_loads_and_samples_as_the_pipeline_it_was_saved_from(langflow_pipe, saved):
    assert torch.equal(sample(LangFlowPipeline.from_pretrained(saved)), sample(langflow_pipe))


def test_nan_in_the_overlap_geometry_is_refused_at_load(saved):
    edit_tensors(saved / STATISTICS_FILE, lambda t: t["base_scales"].__setitem__(0, float("nan")))
    with pytest.raises(ValueError, match=r"sampler_statistics.*'base_scales' holds 1 NaN/Inf.*untied-sc calibrate"):
        LangFlowPipeline.from_pretrained(saved)


def test_inf_in_a_moment_tensor_is_refused_at_load(saved):
    edit_tensors(saved / STATISTICS_FILE, lambda t: t["rms_nfe8"].__setitem__(1, float("inf")))
    with pytest.raises(ValueError, match=r"'rms_nfe8' holds 1 NaN/Inf"):
        LangFlowPipeline.from_pretrained(saved)


def test_a_statistics_file_missing_a_tensor_is_refused_naming_it(saved):
    edit_tensors(saved / STATISTICS_FILE, lambda t: t.pop("mean_nfe4"))
    with pytest.raises(ValueError, match=r"lack tensors \['mean_nfe4'\].*calibrated_steps \[4, 8\]"):
        LangFlowPipeline.from_pretrained(saved)


def test_a_config_claiming_an_nfe_the_file_lacks_is_refused(saved):
    edit_json(saved / "sampler_statistics/config.json", lambda c: c.__setitem__("calibrated_steps", [4, 8, 12]))
    with pytest.raises(ValueError, match=r"lack tensors \['mean_nfe12', 'rms_nfe12', 'cosine_distance_nfe12'\]"):
        LangFlowPipeline.from_pretrained(saved)


def test_an_out_of_range_scheduler_value_is_refused_naming_the_file_and_the_field(saved):
    edit_json(saved / "scheduler/scheduler_config.json", lambda c: c.__setitem__("quantile_eps", 2.0))
    with pytest.raises(ValueError, match=r"scheduler_config.json: quantile_eps = 2.0 lies outside \(0, 0.5\)"):
        LangFlowPipeline.from_pretrained(saved)


@pytest.mark.parametrize(
    ("cls", "key", "value", "allowed"),
    [
        (LangFlowScheduler, "quantile_eps", 0.0, r"\(0, 0.5\)"),
        (ELFScheduler, "t_eps", 1.5, r"\(0, 1\)"),
        (ELFScheduler, "p_std", -0.8, r"\(0, ∞\)"),
        (ELFScheduler, "sde_gamma", float("nan"), r"\[0, ∞\)"),
        (UntiedLangFlowScheduler, "eps_fp", 0.0, r"\(0, ∞\)"),
    ],
)
def test_out_of_range_values_are_refused_when_a_scheduler_is_built(cls, key, value, allowed):
    with pytest.raises(ValueError, match=rf"{cls.__name__} config: {key} = .* lies outside {allowed}"):
        cls(**{key: value})


def test_per_nfe_churn_entries_are_checked_one_by_one():
    with pytest.raises(ValueError, match=r"sde_gamma_by_steps\['16'\] = -1"):
        ELFScheduler(sde_gamma_by_steps={"8": 0.5, "16": -1})


def test_an_unknown_config_key_warns_naming_the_nearest_known_key():
    with pytest.warns(UserWarning, match=r"has no config key 'eta_rr'; it is ignored. Did you mean 'eta_r'\?"):
        UntiedSelfConditioningScheduler.from_config(LangFlowScheduler().config, eta_rr=1.0)
    assert nearest_key("quantile_epss", ["quantile_eps", "eta_r"]) == "quantile_eps"
    assert nearest_key("zzz", ["quantile_eps", "eta_r"]) is None


def test_swapping_between_compatible_schedulers_warns_about_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        untied = UntiedSelfConditioningScheduler.from_config(LangFlowScheduler().config, coefficients="langflow-lm1b")
        LangFlowScheduler.from_config(untied.config)


def test_a_scheduler_of_the_other_family_is_refused_before_sampling(langflow_pipe):
    langflow_pipe.scheduler = ELFScheduler()
    with pytest.raises(ValueError, match=r"ELFScheduler belongs to the 'elf' family.*LangFlowScheduler"):
        sample(langflow_pipe)


def test_a_missing_component_folder_is_named(saved):
    for path in sorted((saved / "scheduler").iterdir()):
        path.unlink()
    (saved / "scheduler").rmdir()
    with pytest.raises(ValueError, match=r"'scheduler' component is missing: .*scheduler does not exist"):
        LangFlowPipeline.from_pretrained(saved)
    # A component passed as an argument needs no folder.
    LangFlowPipeline.from_pretrained(saved, scheduler=LangFlowScheduler())


def test_the_wrong_pipeline_class_is_refused_at_load_naming_the_right_one(saved):
    with pytest.raises(ValueError, match=r"holds a LangFlowPipeline .*LangFlowPipeline.from_pretrained"):
        ELFPipeline.from_pretrained(saved)


@pytest.mark.parametrize("component", ["transformer", "sampler_statistics"])
def test_a_truncated_safetensors_file_is_named_in_the_first_line(saved, component):
    path = saved / component / "diffusion_pytorch_model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError) as raised:
        LangFlowPipeline.from_pretrained(saved)
    assert str(raised.value).splitlines()[0].startswith(f"{path} is truncated")


def test_a_garbage_safetensors_file_is_named_as_corrupt(saved):
    path = saved / STATISTICS_FILE
    path.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match=rf"^{path} is corrupt"):
        LangFlowPipeline.from_pretrained(saved)


def test_safetensors_names_come_from_the_header(tmp_path):
    save_file({"a": torch.zeros(3), "b": torch.ones(2, 2)}, tmp_path / "x.safetensors")
    assert sorted(safetensors_tensor_names(tmp_path / "x.safetensors")) == ["a", "b"]


def test_a_float16_model_with_float32_statistics_says_why_they_do_not_match(tiny_langflow):
    projection = tiny_langflow.backbone.self_cond_proj.weight
    with torch.no_grad():  # weights that float16 rounds (the tiny model's are zero-initialised)
        projection.copy_(torch.randn(projection.shape, generator=torch.Generator().manual_seed(0)) / 3)
    statistics = random_statistics(tiny_langflow, "langflow", steps=(4,))
    statistics.check_model(tiny_langflow)
    with pytest.raises(ValueError, match=r"holds them in torch.float16: rounding changes the hash"):
        statistics.check_model(tiny_langflow.to(torch.float16))


def _counting_fingerprints(monkeypatch) -> list:
    """Counts the hashes `check_model` takes (each copies the input projections to the host)."""
    import untied_sc.schedulers.sampler_statistics as module

    hashed, original = [], module.model_fingerprint

    def counted(model):
        hashed.append(model)
        return original(model)

    monkeypatch.setattr(module, "model_fingerprint", counted)
    return hashed


def test_a_matched_model_is_not_hashed_again_until_its_weights_change(tiny_langflow, monkeypatch):
    projection = tiny_langflow.backbone.self_cond_proj.weight
    with torch.no_grad():
        projection.copy_(torch.randn(projection.shape, generator=torch.Generator().manual_seed(0)))
    statistics = random_statistics(tiny_langflow, "langflow", steps=(4,))
    hashed = _counting_fingerprints(monkeypatch)
    for _ in range(3):
        statistics.check_model(tiny_langflow)
    assert hashed == []  # matched when built: no call copies the weights again
    with torch.no_grad():
        projection.mul_(1.5)  # an in-place write bumps the version counter
    with pytest.raises(ValueError, match="belong to another model"):
        statistics.check_model(tiny_langflow)
    assert len(hashed) == 1


def test_an_equal_copy_of_the_model_is_hashed_once_then_matched(tiny_langflow, monkeypatch):
    import copy
    import pickle

    statistics = random_statistics(tiny_langflow, "langflow", steps=(4,))
    hashed = _counting_fingerprints(monkeypatch)
    twin = copy.deepcopy(tiny_langflow)  # other tensors, equal values
    statistics.check_model(twin)
    statistics.check_model(twin)
    assert len(hashed) == 1
    revived = pickle.loads(pickle.dumps(statistics))  # the match is not carried: the copy hashes again
    revived.check_model(twin)
    assert len(hashed) == 2 and torch.equal(revived.basis, statistics.basis)
    tiny_langflow.backbone.self_cond_proj.weight = torch.nn.Parameter(  # a new tensor in the old one's place
        tiny_langflow.backbone.self_cond_proj.weight.detach() + 1
    )
    with pytest.raises(ValueError, match="belong to another model"):
        statistics.check_model(tiny_langflow)


def test_an_int_generator_is_refused_with_the_seeded_generator_to_pass(langflow_pipe):
    with pytest.raises(TypeError, match=r"torch.Generator\(\).manual_seed\(0\)"):
        sample(langflow_pipe, generator=0)


def test_numpy_integers_are_accepted_for_batch_size_and_steps(langflow_pipe):
    expected = sample(langflow_pipe)
    assert torch.equal(sample(langflow_pipe, batch_size=np.int64(2), num_inference_steps=np.int32(4)), expected)


def test_a_generator_list_must_have_one_generator_per_sample(langflow_pipe):
    with pytest.raises(ValueError, match=r"list of 1 generators for a batch of 2"):
        sample(langflow_pipe, generator=[torch.Generator().manual_seed(0)])


def test_a_generator_per_sample_gives_each_sample_its_own_stream(langflow_pipe):
    """LangFlow's grid is fixed, so sample i of a batch with generators [g_0, g_1] is g_i's sample of a batch of 1."""
    both = sample(langflow_pipe, generator=[torch.Generator().manual_seed(s) for s in (3, 4)])
    alone = [sample(langflow_pipe, batch_size=1, generator=torch.Generator().manual_seed(s)) for s in (3, 4)]
    assert torch.equal(both, torch.cat(alone))


def test_elf_refuses_a_generator_list(tiny_elf):
    pipe = ELFPipeline(tiny_elf, ELFScheduler(), tiny_tokenizer())
    with pytest.raises(ValueError, match="one time grid per batch"):
        sample(pipe, generator=[torch.Generator().manual_seed(s) for s in (0, 1)])


def test_diffusion_pipeline_loads_a_saved_folder_with_trust_remote_code(langflow_pipe, saved):
    from diffusers import DiffusionPipeline

    generic = DiffusionPipeline.from_pretrained(saved, trust_remote_code=True)
    assert type(generic) is LangFlowPipeline
    assert torch.equal(sample(generic), sample(langflow_pipe))
    assert type(load_pipeline(saved)) is LangFlowPipeline


def test_a_changed_module_file_is_not_trusted_silently(saved):
    module = saved / "untied_sc_pipeline.py"
    module.write_text(module.read_text() + "\nprint('hello')\n")
    with pytest.raises(ValueError, match="trust_remote_code"):
        LangFlowPipeline.from_pretrained(saved)


@pytest.mark.parametrize("name", ["elf-small", "langflow-small"])
def test_diffusion_pipeline_loads_the_bundled_pipelines_as_the_package_class(name):
    from diffusers import DiffusionPipeline

    from untied_sc.pipelines.loading import PIPELINES

    folder = f"hub_artifacts/{name}"
    generic = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
    package = load_pipeline(folder)
    assert type(generic) is type(package) and type(generic) in PIPELINES.values()
    kwargs = {"batch_size": 2, "num_inference_steps": 8, "output_type": "seq"}
    first = generic(generator=torch.Generator().manual_seed(5), **kwargs).sequences
    second = package(generator=torch.Generator().manual_seed(5), **kwargs).sequences
    assert torch.equal(first, second)


def test_a_repo_id_that_cannot_be_fetched_names_itself_and_the_way_out():
    from untied_sc.hub import resolve_local

    with pytest.raises(OSError, match=r"Could not fetch 'someone/not-here' from the Hugging Face Hub .* local file"):
        resolve_local("someone/not-here", local_files_only=True)  # no network needed: the cache has no snapshot


# ---- a network config that does not fit its weights --------------------------------------------------------------


@pytest.fixture
def saved_elf(tiny_elf, tmp_path):
    folder = tmp_path / "elf"
    ELFPipeline(tiny_elf, ELFScheduler(), tiny_tokenizer()).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("family", "field", "value", "weights_value"),
    [
        ("langflow", "num_layers", 1, 2),  # a block dropped: diffusers printed the unused names and sampled
        ("langflow", "num_layers", 3, 2),
        ("langflow", "hidden_size", 64, 32),
        ("langflow", "num_attention_heads", 2, 4),  # the rotary table's width fixes the heads
        ("langflow", "self_conditioning", False, True),
        ("elf", "num_layers", 1, 2),
        ("elf", "intermediate_size", 44, 42),
        ("elf", "num_mode_tokens", 2, 4),
    ],
)
def test_a_network_config_that_does_not_fit_its_weights_is_refused_naming_file_field_and_both_values(
    saved, saved_elf, family, field, value, weights_value
):
    folder = saved if family == "langflow" else saved_elf
    config_path = folder / "transformer" / "config.json"
    edit_json(config_path, lambda config: config.update({field: value}))
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    expected = (
        f"{config_path} does not fit its weights {weights}: {field} = {value!r} in config.json, {weights_value!r}"
    )
    fix = f'Fix: set "{field}": {json.dumps(weights_value)} in {config_path}'
    with pytest.raises(ValueError) as error:
        load_pipeline(folder)
    assert expected in str(error.value) and fix in str(error.value)
    cls = LangFlowTransformerModel if family == "langflow" else ELFTransformerModel
    with pytest.raises(ValueError, match="does not fit its weights"):  # the model loaded on its own: the same
        cls.from_pretrained(folder / "transformer")
    with pytest.raises(ValueError, match="does not fit its weights"):
        cls.from_pretrained(folder, subfolder="transformer")


def test_unused_or_missing_tensors_are_refused_listing_them(saved):
    weights = saved / "transformer" / "diffusion_pytorch_model.safetensors"
    edit_tensors(weights, lambda tensors: tensors.update({"backbone.extra.weight": torch.zeros(3)}))
    with pytest.raises(ValueError, match=r"unused tensors \(1\): backbone.extra.weight"):
        load_pipeline(saved)
    edit_tensors(weights, lambda tensors: [tensors.pop("backbone.extra.weight"), tensors.pop("proposal.loc")])
    with pytest.raises(ValueError, match=r"does not fit its weights .*missing tensors \(1\): proposal.loc"):
        load_pipeline(saved)


def test_a_max_length_other_than_the_trained_one_is_refused_naming_both_files(saved):
    (saved / "training_info.json").write_text(json.dumps({"config": {"seq_len": 12}}))
    assert load_pipeline(saved).transformer.config.max_length == 12  # as trained: loads
    config_path = saved / "transformer" / "config.json"
    edit_json(config_path, lambda config: config.update({"max_length": 24}))
    with pytest.raises(ValueError) as error:
        load_pipeline(saved)
    message = str(error.value)
    assert message.startswith(f"{config_path}: max_length = 24, but {saved / 'training_info.json'} records")
    assert "seq_len 12" in message and f'Fix: set "max_length": 12 in {config_path}' in message


@pytest.mark.parametrize("name", ["elf-small", "langflow-small"])
def test_the_bundled_folders_and_bf16_weights_still_load(name, tmp_path):
    pipe = load_pipeline(f"hub_artifacts/{name}")  # bf16 safetensors, float32 load
    folder = tmp_path / name
    pipe.transformer.to(torch.bfloat16).save_pretrained(folder)
    assert type(pipe.transformer).from_pretrained(folder, dtype=torch.bfloat16).dtype == torch.bfloat16
