"""The compiled network: `pipe.compile_network()` and a user's `torch.compile(pipe.transformer)`.

The graphs run under a counting backend that executes each traced graph as traced: dynamo's tracing, graph breaks and
recompiles are real, the arithmetic is eager's, so samples compare bit for bit (inductor's rounding is not tested
here: its CPU build of C++ kernels takes minutes on the 2-core CI machine).
"""

import pytest
import torch
from diffusers.utils.torch_utils import is_compiled_module
from safetensors import safe_open

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler, UntiedSelfConditioningScheduler
from untied_sc.pipelines.network import is_compiled_network, owned_outputs

from .tiny import random_statistics, tiny_tokenizer


# Graphs one sampling call compiles: the first step (no self-conditioning input), the later steps, and ELF's decode
# pass. One more would be a graph break (the network split in two, and under CUDA graphs eager Python between them).
GRAPHS = {"elf": 3, "langflow": 2}
COEFFICIENTS = {"eta_r": 2.0, "eta_t": 1.5, "eta_o": 1.2, "alpha": 0.7}


class GraphCounter:
    """A `torch.compile` backend that runs each graph dynamo traced as it is (eager's arithmetic) and counts them."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs) -> callable:
        self.graphs += 1
        return graph_module.forward


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: dynamo's caches live on the forward's code object, shared by every model."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def make_pipeline(request):
    def make(family: str, scheduler: str = "official"):
        model = request.getfixturevalue(f"tiny_{family}")
        if family == "elf":
            pipe = ELFPipeline(model, ELFScheduler(), tiny_tokenizer())
        else:
            pipe = LangFlowPipeline(model, LangFlowScheduler(), tiny_tokenizer())
        if scheduler == "untied":
            pipe.register_modules(sampler_statistics=random_statistics(model, family, steps=(8,)))
            pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, **COEFFICIENTS)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    return make


def _sample(pipe, seed: int = 0, batch_size: int = 2):
    generator = torch.Generator().manual_seed(seed)
    return pipe(batch_size=batch_size, num_inference_steps=8, generator=generator, output_type="seq")


def _assert_same_samples(got, expected) -> None:
    assert torch.equal(got.latents, expected.latents)
    assert torch.equal(got.sequences, expected.sequences)


def _saved_files(folder) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _weight_names(folder) -> list[str]:
    with safe_open(folder / "transformer" / "diffusion_pytorch_model.safetensors", "pt") as handle:
        return list(handle.keys())


@pytest.mark.parametrize("scheduler", ["official", "untied"])
@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_compiled_network_gives_the_uncompiled_samples_and_compiles_once_per_kind_of_call(
    make_pipeline, family, scheduler
):
    pipe = make_pipeline(family, scheduler)
    eager = _sample(pipe)
    counter = GraphCounter()
    assert pipe.compile_network(backend=counter) is pipe
    compiled, again = _sample(pipe), _sample(pipe)
    _assert_same_samples(compiled, eager)
    _assert_same_samples(again, eager)  # the same seed, the same samples
    # the second call, and every step after the first, reuse the graphs: no recompiles, no graph breaks
    assert counter.graphs == GRAPHS[family]
    assert type(pipe.transformer).__name__.endswith("TransformerModel") and is_compiled_network(pipe.transformer)


def test_a_new_batch_size_recompiles_and_still_gives_the_uncompiled_samples(make_pipeline):
    pipe = make_pipeline("langflow")
    eager = _sample(pipe, batch_size=3)
    counter = GraphCounter()
    pipe.compile_network(backend=counter)
    _sample(pipe, batch_size=2)
    _assert_same_samples(_sample(pipe, batch_size=3), eager)
    assert counter.graphs == 2 * GRAPHS["langflow"]


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_save_pretrained_of_a_compiled_pipeline_writes_the_uncompiled_files(tmp_path, make_pipeline, family):
    pipe = make_pipeline(family, "untied")
    pipe.save_pretrained(tmp_path / "eager")
    pipe.compile_network(backend=GraphCounter())
    pipe.save_pretrained(tmp_path / "compiled")
    assert _saved_files(tmp_path / "compiled") == _saved_files(tmp_path / "eager")
    assert not any(name.startswith("_orig_mod.") for name in _weight_names(tmp_path / "compiled"))


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_a_user_compiled_transformer_samples_saves_and_reloads_as_the_module_itself(tmp_path, make_pipeline, family):
    """diffusers' `pipe.transformer = torch.compile(pipe.transformer)`: the pipeline reads the model's config, family,
    statistics fingerprint (and LangFlow's proposal and E_norm) through the wrapper, and saves the module inside it."""
    pipe = make_pipeline(family, "untied")
    eager = _sample(pipe)
    pipe.save_pretrained(tmp_path / "eager")
    counter = GraphCounter()
    pipe.transformer = torch.compile(pipe.transformer, backend=counter)
    assert is_compiled_module(pipe.transformer)
    _assert_same_samples(_sample(pipe), eager)
    assert counter.graphs == GRAPHS[family]

    pipe.save_pretrained(tmp_path / "compiled")
    assert _saved_files(tmp_path / "compiled") == _saved_files(tmp_path / "eager")
    reloaded = type(pipe).from_pretrained(tmp_path / "compiled")
    reloaded.set_progress_bar_config(disable=True)
    _assert_same_samples(_sample(reloaded), eager)

    wrapper = pipe.transformer
    pipe.compile_network(backend=GraphCounter())  # compiles the module itself, not the wrapper again
    assert pipe.transformer is wrapper._orig_mod and not is_compiled_module(pipe.transformer)
    assert is_compiled_network(pipe.transformer)


def test_network_outputs_on_a_cpu_are_handed_on_without_a_copy(make_pipeline):
    """The copy out of CUDA graphs' static buffers is for CUDA tensors only; on a CPU it would cost a pass per step."""
    pipe = make_pipeline("langflow")
    output = pipe.transformer(torch.zeros(2, *pipe.latent_shape), torch.tensor(1.0))
    assert owned_outputs(output) is output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_cuda_graphs_give_the_eager_tokens_with_the_untied_scheduler(make_pipeline, family):
    """`mode="reduce-overhead"` on a GPU: the scheduler keeps outputs across steps, and they stay intact."""
    pipe = make_pipeline(family, "untied").to("cuda")
    eager = _sample(pipe)
    pipe.compile_network(mode="reduce-overhead")
    for _ in range(2):  # the first call records the graphs, the second replays them
        compiled = _sample(pipe)
        assert torch.equal(compiled.sequences, eager.sequences)
        torch.testing.assert_close(compiled.latents, eager.latents, rtol=1e-4, atol=1e-4)
