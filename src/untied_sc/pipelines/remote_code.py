"""The module file that lets `diffusers.DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)` load a
pipeline of this package.

diffusers looks a pipeline class up in its own namespace unless `model_index.json` names it as `[module, class]` with
`<module>.py` in the folder; that file is then imported as remote code. Ours only re-exports the package's classes,
so the pipeline that loads is the package's own. Our classes' `from_pretrained` recognise the file by its exact
text and load without `trust_remote_code`; any other text is left to diffusers' rule (the user must trust it).
"""

import json
from pathlib import Path


MODULE_NAME = "untied_sc_pipeline"
MODULE_TEXT = '''"""Loads this folder with `diffusers.DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`.

The pipeline classes live in the untied-sc package (`pip install untied-sc`); this file only re-exports them.
"""

from untied_sc.pipelines import ELFPipeline, LangFlowPipeline  # noqa: F401
'''


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
    """Writes the module file into a saved pipeline folder and names it in `model_index.json`."""
    index_path = folder / "model_index.json"
    index = json.loads(index_path.read_text())
    index["_class_name"] = [MODULE_NAME, saved_class_name(index)]
    (folder / f"{MODULE_NAME}.py").write_text(MODULE_TEXT)
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
