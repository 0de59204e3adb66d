"""The library (`untied_sc`) and the lab (`untied_sc_lab`) are two packages with imports one way: the lab uses only
the library's public names, the library never imports the lab, and the user's commands (`convert`, `calibrate`,
`generate`) run with the lab absent."""

import ast
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import save_file

from .conftest import Golden
from .tiny import tiny_tokenizer_folder


ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "src" / "untied_sc"
LAB = ROOT / "lab" / "src" / "untied_sc_lab"


def _imports(folder: Path):
    """(file, line, module, names) of every absolute import under `folder` (`names` empty for `import module`)."""
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.lineno, node.module, [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name, []


def _public_names(module_name: str) -> set[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name in vars(module) if not name.startswith("_")]
    return set(names)


def test_the_lab_imports_only_the_librarys_public_names():
    wrong = []
    for path, line, module, names in _imports(LAB):
        parts = module.split(".")
        if parts[0] != "untied_sc":
            continue
        where = f"{path.relative_to(ROOT)}:{line}"
        if len(parts) > 2 or any(part.startswith("_") for part in parts):
            wrong.append(f"{where} imports the library's inner module {module}")
            continue
        public = _public_names(module)
        wrong += [f"{where} imports {module}.{name}, not a public name" for name in names if name not in public]
    assert not wrong, "\n".join(wrong)


def test_the_library_never_imports_the_lab():
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path, line, module, _ in _imports(LIBRARY)
        if module.split(".")[0] == "untied_sc_lab"
    ]
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in LIBRARY.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > len(path.relative_to(LIBRARY).parts)
    ]
    assert not wrong and not relative, wrong + relative


def test_every_public_name_the_library_exports_resolves():
    for module_name in ("untied_sc", "untied_sc.generation"):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module_name}.{name}"


# The user's path with the lab uninstalled: the package cannot be imported and declares no commands.
WITHOUT_LAB = textwrap.dedent(
    """
    import importlib.metadata, sys
    sys.modules["untied_sc_lab"] = None  # import untied_sc_lab raises ImportError
    everything = importlib.metadata.entry_points
    importlib.metadata.entry_points = lambda **kw: [] if kw.get("group") == "untied_sc.commands" else everything(**kw)
    from untied_sc.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _without_lab(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_LAB, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.usefixtures("one_thread")
def test_convert_calibrate_and_generate_run_without_the_lab(tmp_path):
    golden = Golden("langflow_sample_nfe8.safetensors")
    source = tmp_path / "official"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "LangFlow", **golden.config}))
    save_file(golden.weights, source / "model.safetensors")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    steps = [
        ("convert", "langflow", str(source), "pipe", "--tokenizer", tokenizer),
        ("calibrate", "pipe", "--nfe", "4", "--bank-size", "2", "--batch-size", "2", "--no-progress"),
        ("generate", "pipe", "--nfe", "4", "--num-samples", "2", "--batch-size", "2", "--out", "samples.jsonl"),
    ]
    for argv in steps:
        done = _without_lab(*argv, cwd=tmp_path)
        assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 2


def test_a_lab_command_without_the_lab_says_how_to_install_it(tmp_path):
    done = _without_lab("tune", "pipe", "--nfe", "8", cwd=tmp_path)
    assert done.returncode == 2
    assert "lab" in done.stderr and 'pip install "untied-sc[lab]"' in done.stderr
    assert "Traceback" not in done.stderr


# A sampler spec that sets an ablation switch, built with the lab absent (its schedulers are then not registered).
SPEC_WITHOUT_LAB = textwrap.dedent(
    """
    import sys
    from types import SimpleNamespace
    sys.modules["untied_sc_lab"] = None
    from untied_sc.generation import build_scheduler
    build_scheduler(SimpleNamespace(family="elf"), {"scheduler": "untied", "correction_routing": "both"}, config={})
    """
)


def test_a_sampler_spec_with_an_ablation_switch_without_the_lab_says_how_to_install_it():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(LIBRARY.parent), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", SPEC_WITHOUT_LAB], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("ValueError: 'correction_routing'") and 'pip install "untied-sc[lab]"' in message


def test_the_lab_registers_its_ablation_schedulers_with_the_library():
    from untied_sc.untied_variants import untied_variant_class
    from untied_sc_lab.ablations import AblationUntiedELFScheduler, AblationUntiedLangFlowScheduler

    assert untied_variant_class("elf", {"eta_t": 1.0}) is None
    assert untied_variant_class("elf", {"eta_t": 1.0, "correction_direction": "common"}) is AblationUntiedELFScheduler
    assert untied_variant_class("langflow", ["cosine_distance"]) is AblationUntiedLangFlowScheduler


def test_the_lab_adds_its_commands_when_installed():
    from untied_sc.cli import LAB_COMMANDS, build_parser

    choices = build_parser()._subparsers._group_actions[0].choices
    assert set(LAB_COMMANDS) <= set(choices)
