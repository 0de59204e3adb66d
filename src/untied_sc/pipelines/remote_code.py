"""The module file that lets `diffusers.DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)` load a
pipeline of this package.

diffusers looks a pipeline class up in its own namespace unless `model_index.json` names it as `[module, class]` with
`<module>.py` in the folder; that file is then imported as remote code. Ours only re-exports the package's classes,
so the pipeline that loads is the package's own. Our classes' `from_pretrained` recognise the file by its exact
text and load without `trust_remote_code`; any other text is left to diffusers' rule (the user must trust it).

From a Hub repo id, diffusers also refuses every component whose library is neither its own nor a module file in the
component's folder (`transformer/untied_sc.models.langflow_transformer.py`), before it imports the pipeline module.
So each of the package's components gets such a file too, re-exporting the package class (`COMPONENT_TEXT`).
"""

import json
from pathlib import Path


MODULE_NAME = "untied_sc_pipeline"
MODULE_TEXT = '''"""Loads this folder with `diffusers.DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`.

The pipeline classes live in the untied-sc package (`pip install untied-sc`); this file only re-exports them.
"""

from untied_sc.pipelines import ELFPipeline, LangFlowPipeline  # noqa: F401
'''


COMPONENT_TEXT = '''"""Lets `diffusers.DiffusionPipeline.from_pretrained(repo_id, trust_remote_code=True)` load this component.

The class lives in the untied-sc package (`pip install untied-sc`); this file only re-exports it.
"""

from {module} import {name}  # noqa: F401
'''


def package_components(index: dict) -> dict[str, tuple[str, str]]:
    """The components a `model_index.json` takes from this package: {component: (module, class)}."""
    return {
        component: (value[0], value[1])
        for component, value in index.items()
        if not component.startswith("_")
        and isinstance(value, list)
        and len(value) == 2
        and all(isinstance(part, str) for part in value)
        and value[0].startswith("untied_sc.")
    }


def is_package_component(folder: Path, component: str, module: str, name: str) -> bool:
    """Whether `folder/component` holds the module file for `module.name` and it is exactly ours."""
    path = folder / component / f"{module}.py"
    return path.is_file() and path.read_text() == COMPONENT_TEXT.format(module=module, name=name)


def saved_class_name(index: dict) -> str | None:
    """The pipeline class a `model_index.json` names, as a plain name or as diffusers' `[module, class]`."""
    name = index.get("_class_name")
    return name[-1] if isinstance(name, list | tuple) else name


def is_package_module(folder: Path) -> bool:
    """Whether `folder`'s `model_index.json` names our module file and the file is exactly ours."""
    index = json.loads((folder / "model_index.json").read_text())
    name = index.get("_class_name")
    module = folder / f"{MODULE_NAME}.py"
    return isinstance(name, list) and name[0] == MODULE_NAME and module.is_file() and module.read_text() == MODULE_TEXT


def write_remote_code(folder: Path) -> None:
    """Writes the module files into a saved pipeline folder (the pipeline's, each package component's) and names the
    pipeline's in `model_index.json`."""
    index_path = folder / "model_index.json"
    index = json.loads(index_path.read_text())
    index["_class_name"] = [MODULE_NAME, saved_class_name(index)]
    (folder / f"{MODULE_NAME}.py").write_text(MODULE_TEXT)
    for component, (module, name) in package_components(index).items():
        if (folder / component).is_dir():
            (folder / component / f"{module}.py").write_text(COMPONENT_TEXT.format(module=module, name=name))
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
