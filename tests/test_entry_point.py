"""diffusers' generic entry point, `DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`, in a fresh
interpreter.

diffusers resolves a component's library (`model_index.json`'s `[module, class]`) only among the modules already
imported, so within the test session, where other tests imported the whole package, loading proves nothing. Each
load here runs in its own `sys.executable` with nothing imported beforehand, on this source tree, with a module cache
of its own (diffusers copies the folder's module file there).
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ("elf-small", "langflow-small")

# Loads argv[1] generically, samples 2 steps of batch 1, saves a copy to argv[2] if given, prints what it got as JSON.
SCRIPT = """
import json, sys
assert not [name for name in sys.modules if name.startswith("untied_sc")], "untied_sc was imported beforehand"
import torch
from diffusers import DiffusionPipeline

pipe = DiffusionPipeline.from_pretrained(sys.argv[1], trust_remote_code=True)
pipe.set_progress_bar_config(disable=True)
output = pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="seq")
if len(sys.argv) > 2:
    pipe.save_pretrained(sys.argv[2])
print(json.dumps({
    "package": sys.modules["untied_sc"].__file__,
    "pipeline": f"{type(pipe).__module__}.{type(pipe).__name__}",
    "components": {name: type(value).__name__ for name, value in pipe.components.items()},
    "tokens": output.sequences.tolist(),
}))
"""


def _load_fresh(folder: Path, modules: Path, copy_to: Path | None = None) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        "HF_MODULES_CACHE": str(modules),
        "HF_HUB_OFFLINE": "1",
    }
    argv = [sys.executable, "-c", SCRIPT, str(folder), *([str(copy_to)] if copy_to else [])]
    done = subprocess.run(argv, cwd=modules.parent, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{folder}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_diffusion_pipeline_loads_the_bundled_folders_and_their_copies_in_a_fresh_interpreter(tmp_path):
    copies = {name: tmp_path / f"{name}-copy" for name in BUNDLED}
    # Two processes at a time, each fresh: the bundled folders (which save the copies), then the copies.
    with ThreadPoolExecutor(len(BUNDLED)) as pool:
        loads = {
            name: pool.submit(_load_fresh, ROOT / "hub_artifacts" / name, tmp_path / f"{name}-modules", copies[name])
            for name in BUNDLED
        }
        bundled = {name: load.result() for name, load in loads.items()}
        loads = {name: pool.submit(_load_fresh, copies[name], tmp_path / f"{name}-copy-modules") for name in BUNDLED}
        copied = {name: load.result() for name, load in loads.items()}
    expected = {"elf-small": "pipeline_elf.ELFPipeline", "langflow-small": "pipeline_langflow.LangFlowPipeline"}
    for name in BUNDLED:
        for got in (bundled[name], copied[name]):
            assert Path(got["package"]).is_relative_to(ROOT / "src"), got["package"]  # this source tree
            assert got["pipeline"] == f"untied_sc.pipelines.{expected[name]}"  # the package's class
            # ace_statistics is the component whose module nothing else imports
            assert got["components"]["ace_statistics"] == "ACEStatistics"
            assert got["components"]["sampler_statistics"] == "SamplerStatistics"
        assert copied[name]["components"] == bundled[name]["components"]
        assert copied[name]["tokens"] == bundled[name]["tokens"]  # same weights, same seed: same tokens
        assert len(bundled[name]["tokens"]) == 1


def test_diffusion_pipeline_loads_a_converted_official_checkpoint_in_a_fresh_interpreter(tmp_path):
    from untied_sc.cli import main

    from .test_convert_pipeline import official_elf_folder
    from .tiny import tiny_tokenizer_folder

    source = official_elf_folder(tmp_path / "elf-official")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    assert main(["convert", "elf", str(source), str(tmp_path / "elf"), "--tokenizer", tokenizer]) == 0
    got = _load_fresh(tmp_path / "elf", tmp_path / "modules")
    assert got["pipeline"] == "untied_sc.pipelines.pipeline_elf.ELFPipeline"
    assert got["components"]["scheduler"] == "ELFScheduler" and len(got["tokens"]) == 1
