"""What a pipeline writes: diffusers' `save_pretrained` guarded against mixing two models in one folder, the model
card and provenance of a converted pipeline, the remote-code module file, and the sampler statistics (a flow map's
too) on their own."""

import json
import os
import shutil
from pathlib import Path

from .remote_code import saved_class_name, write_remote_code


def saved_pipeline_class(folder: Path) -> str | None:
    """The pipeline class `folder/model_index.json` names; `None` without one; `"an unreadable model_index.json"`
    for one that cannot be read (a folder of unknown content counts as another pipeline)."""
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        return None
    try:
        return str(saved_class_name(json.loads(index_path.read_text())))
    except (OSError, ValueError, AttributeError):
        return "an unreadable model_index.json"


def clear_folder(folder: Path) -> None:
    """Removes everything inside `folder`, keeping the folder itself."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


class SavingMixin:
    """The saving methods of [`LanguageFlowPipeline`], over diffusers' `DiffusionPipeline` ones."""

    def save_pretrained(self, save_directory: str | os.PathLike, *args, overwrite: bool = False, **kwargs) -> None:
        """
        diffusers' `save_pretrained`, guarded against mixing two models in one folder: a non-empty folder that holds
        another pipeline (its `model_index.json` names another class) is refused unless `overwrite=True`, which
        first empties the folder, so no file of the other model (its model card, `training_info.json`,
        `latent_normalization.json`, ...) stays behind. Saving over a pipeline of the same class (say after
        `calibrate`) writes into the folder as diffusers does, keeping its other files.

        Args:
            save_directory (`str` or `os.PathLike`): the folder to write.
            overwrite (`bool`, defaults to `False`): replace the folder's contents, whatever it holds.
            args, kwargs: passed to `DiffusionPipeline.save_pretrained` (`safe_serialization`, `push_to_hub`, ...).

        A pipeline built by `from_official` also writes its model card, README.md (the source, its revision and
        every setting with where it was read), where the folder has none.
        """
        folder = Path(save_directory)
        if folder.is_dir() and any(folder.iterdir()):
            if overwrite:
                clear_folder(folder)
            else:
                held = saved_pipeline_class(folder)
                if held != type(self).__name__ and held is not None:
                    raise FileExistsError(
                        f"{folder} holds another pipeline ({held}, named by {folder / 'model_index.json'}), not a "
                        f"{type(self).__name__}: saving here would leave that model's files (model card, "
                        "training_info.json, ...) beside this one's. Pass `save_pretrained(..., overwrite=True)` to "
                        "replace the folder's contents, or save to a new folder."
                    )
        super().save_pretrained(save_directory, *args, **kwargs)
        conversion = getattr(self, "conversion", None)  # set by `from_official`: the folder gets its model card
        if conversion is not None and not (folder / "README.md").exists():
            from .official_card import official_model_card

            card = official_model_card(conversion, type(self).__name__, self.scheduler.config)
            (folder / "README.md").write_text(card, encoding="utf-8")
        # Where the weights came from (the conversion, the Hub pipeline repo): a copy keeps it (`write_provenance`).
        from .statistics_repo import write_provenance

        write_provenance(self, folder)

    def save_sampler_statistics(
        self, save_directory: str | os.PathLike, repo_id: str | None = None, overwrite: bool = False
    ) -> Path:
        """
        Saves this pipeline's sampler statistics on their own, as a statistics folder (a few MB, no weights):
        `sampler_statistics/`, `coefficients.json` (the scheduler config's `coefficients_by_steps` and
        `tuning_by_steps`), `base_checkpoint.json` (the weights: the pipeline repo and the official checkpoint with
        their revision and commit where known, and the weights' fingerprint) and a model card, README.md, saying how
        to load it: `from_pretrained(BASE, sampler_statistics=save_directory)`.

        The folder is written whole beside `save_directory` and renamed onto it: an error leaves it as it was.

        Args:
            save_directory (`str` or `os.PathLike`): the folder to write (refused when not empty, unless
                `overwrite`).
            repo_id (`str`, *optional*): the repo the folder will be uploaded to, for the model card's instructions.
            overwrite (`bool`, defaults to `False`): replace a non-empty folder.

        Returns:
            The folder written.
        """
        from .statistics_repo import save_statistics_folder

        return save_statistics_folder(self, save_directory, repo_id=repo_id, overwrite=overwrite)

    def push_sampler_statistics(
        self,
        repo_id: str,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | None = None,
        create_pr: bool = False,
        save_directory: str | os.PathLike | None = None,
    ) -> str:
        """
        Uploads this pipeline's sampler statistics on their own (the folder [`save_sampler_statistics`] writes) to
        the Hub repo `repo_id`, created where missing, as diffusers' `push_to_hub` does for a whole pipeline. A
        failure to reach the Hub is one [`~untied_sc.hub.HubPushError`] naming the folder kept on disk and the
        `hf upload` command that pushes it later.

        Args:
            repo_id (`str`): the statistics repo.
            commit_message (`str`, *optional*): default: "Sampler statistics for <the base weights>".
            private (`bool`, *optional*), token (`str`, *optional*), create_pr (`bool`): as in `push_to_hub`.
            save_directory (`str` or `os.PathLike`, *optional*): write the folder there (refused when not empty)
                and keep it; default: a temporary folder, removed after a successful upload.

        Returns:
            The commit hash of the upload.
        """
        from .statistics_repo import push_statistics

        return push_statistics(self, repo_id, commit_message, private, token, create_pr, save_directory)

    def save_config(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """
        diffusers' `model_index.json`, plus the module file that lets `DiffusionPipeline.from_pretrained(folder,
        trust_remote_code=True)` load the folder (see `pipelines/remote_code.py`); `save_pretrained` calls this
        before any upload, so a pushed repo has both.
        """
        super().save_config(save_directory, *args, **kwargs)
        write_remote_code(Path(save_directory))


class FlowMapStatisticsSavingMixin:
    """The statistics methods of [`FlowMapPipeline`]: its `flowmap_statistics` saved and pushed on their own, by the
    same path as [`SavingMixin.save_sampler_statistics`] / [`SavingMixin.push_sampler_statistics`]."""

    def save_flowmap_statistics(
        self, save_directory: str | os.PathLike, repo_id: str | None = None, overwrite: bool = False
    ) -> Path:
        """
        Saves this pipeline's flow-map statistics on their own, as a statistics folder (no weights):
        `flowmap_statistics/` (the component), `base_checkpoint.json` (the weights' fingerprint) and a model card,
        README.md, saying how to load it: `FlowMapPipeline.from_pretrained(BASE, flowmap_statistics=save_directory)`.
        Written whole beside `save_directory` and renamed onto it: an error leaves it as it was.

        Args:
            save_directory (`str` or `os.PathLike`): the folder to write (refused when not empty, unless
                `overwrite`).
            repo_id (`str`, *optional*): the repo the folder will be uploaded to, for the model card's instructions.
            overwrite (`bool`, defaults to `False`): replace a non-empty folder.

        Returns:
            The folder written.
        """
        from .statistics_repo import save_statistics_folder

        return save_statistics_folder(self, save_directory, repo_id=repo_id, overwrite=overwrite)

    def push_flowmap_statistics(
        self,
        repo_id: str,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | None = None,
        create_pr: bool = False,
        save_directory: str | os.PathLike | None = None,
    ) -> str:
        """
        Uploads this pipeline's flow-map statistics on their own (the folder [`save_flowmap_statistics`] writes) to
        the Hub repo `repo_id`, created where missing; the arguments and the failure are
        [`SavingMixin.push_sampler_statistics`]'s (default message: "Flow-map statistics for <the base weights>").

        Returns:
            The commit hash of the upload.
        """
        from .statistics_repo import push_statistics

        return push_statistics(self, repo_id, commit_message, private, token, create_pr, save_directory)
