"""Training the bundled models: corpus build, tokenizer, and the LangFlow objective (see docs/training.md).

Entry points: `python -m untied_sc_lab.training.corpus`, `python -m untied_sc_lab.training.tokenizer`,
`python -m untied_sc_lab.training.langflow {train,export,evaluate}`, `python -m untied_sc_lab.training.elf
{train,encode,export,evaluate}`. Names are imported lazily, so that running a
submodule with `-m` does not import it twice.
"""

import importlib


_EXPORTS = {
    "build_corpus": "corpus",
    "fixed_windows": "data",
    "load_split_tokens": "data",
    "sample_windows": "data",
    "unigram_entropy": "data",
    "EMA": "ema",
    "ema_decay_at": "ema",
    "FlowTrainer": "trainer",
    "TrainConfig": "langflow",
    "LangFlowTrainConfig": "langflow",
    "LangFlowTrainer": "langflow",
    "evaluate_per_gamma": "langflow",
    "export_pipeline": "langflow",
    "format_gamma_table": "langflow",
    "load_run_model": "langflow",
    "ProposalStats": "proposal",
    "fit_gumbel_to_curve": "proposal",
    "sample_gamma": "proposal",
    "train_tokenizer": "tokenizer",
    "ELFTrainConfig": "elf",
    "ELFTrainer": "elf",
    "evaluate_per_time": "elf",
    "evaluate_decoder": "elf",
    "format_time_table": "elf",
    "sc_cfg_target": "elf",
    "EncodedWindows": "encoder",
    "FrozenTextEncoder": "encoder",
    "LatentNormalization": "encoder",
    "load_minilm_encoder": "encoder",
    "load_minilm_tokenizer": "encoder",
    "paragraph_windows": "encoder",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
