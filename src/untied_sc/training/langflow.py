"""Training a small LangFlow on CPU: objective, loop, checkpoints, per-γ evaluation and export.

Objective (one optimiser step on a batch of random `seq_len`-token windows x):

* γ ~ Gumbel(loc, scale) clamped to [γ_min, γ_max] (the model's own proposal, `proposal.loc/scale`);
  α² = sigmoid(−γ), σ² = sigmoid(γ); z = α·E_norm[x] + σ·ε (E_norm: the learned, row-normalised embedding).
* Self-conditioning with probability `sc_prob` per example: a no-grad first pass with zero SC input gives
  x̂ = softmax(logits)·E_norm, fed (detached) as the SC input of the second pass; other examples get zeros.
* Loss: cross-entropy of the clean tokens under the logits head (which includes the α/σ²·z·E_normᵀ skip term).
* AdamW (no decay on the embedding, norms and biases), linear warm-up then cosine decay, gradient clipping, and an
  EMA of the weights, which is what gets exported.
* The transformer runs under bf16 autocast (`autocast="bf16"`; the skip term and the loss stay float32), as
  the official code runs its backbone in bf16; evaluation and export are float32.
* `device="cuda"` trains on a GPU (same objective; the latent noise ε then comes from a generator on the GPU, so a
  GPU run is reproducible on GPUs but not bit for bit against a CPU run). CPU is the default and the documented
  fallback recipe.

Proposal (`proposal="fit"`, the default): from step `proposal_start` on, every `proposal_every` steps, the Gumbel is
refitted to the running per-γ training loss curve so that its CDF follows CE(γ)/H_unigram
(:mod:`untied_sc.training.proposal`): the training noise concentrates where the loss changes with γ, i.e. where
there is something to learn, and the sampler's grid (the proposal's quantiles) spends its steps there too. Each
refit moves loc by at most `proposal_max_move` (scale by half that), and refits stop after `proposal_freeze` of
the run, so the last part trains on exactly the proposal that is saved. `proposal="fixed"` keeps the initial
`proposal_loc/scale`.

Run `python -m untied_sc.training.langflow train --help`.
"""

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..hardware import warn_if_emulated_bfloat16
from ..models import LangFlowTransformerModel
from ..schedulers.scheduling_langflow import LangFlowScheduler
from .config import LangFlowTrainConfig, TrainConfig  # noqa: F401 (TrainConfig: importable from here too)
from .data import fixed_windows, load_split_tokens, sample_windows, unigram_entropy
from .ema import EMA
from .proposal import ProposalStats, fit_gumbel_to_curve, gumbel_entropy, gumbel_range, sample_gamma


CHECKPOINT = "checkpoint.pt"
LOG = "loss_log.jsonl"
VALIDATION_GAMMAS = (3.0, 4.0, 5.0)
DEFAULT_EVAL_GAMMAS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 12.0)
# Options that may differ on `--resume` without changing what the run computes (or, for the step limits, only
# where it ends).
RESUME_OVERRIDABLE = ("budget_minutes", "max_steps", "checkpoint_minutes", "snapshot_minutes", "threads", "progress")


def _model_kwargs(config) -> dict:
    """The constructor arguments in a model config (without diffusers' private `_*` entries)."""
    return {key: value for key, value in dict(config).items() if not key.startswith("_")}


# The sampler's noising is the objective's: one copy, `LangFlowScheduler.add_noise` (it holds no state).
NOISING = LangFlowScheduler()


def noisy_latents(model: LangFlowTransformerModel, ids: torch.Tensor, gamma: torch.Tensor, noise: torch.Tensor):
    """z = α·E_norm[x] + σ·ε with α² = sigmoid(−γ), σ² = sigmoid(γ) (`LangFlowScheduler.add_noise`)."""
    return NOISING.add_noise(model.embed(ids), noise, gamma)


def forward_logits(
    model: LangFlowTransformerModel,
    z: torch.Tensor,
    gamma: torch.Tensor,
    self_conditioning: torch.Tensor | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """
    `model(z, γ, m).logits`, with the transformer (SC projection, blocks, output layer) optionally under autocast
    and the α/σ²·z·E_normᵀ skip term always in float32, as the official LangFlow runs its backbone in bf16 autocast
    and the skip outside it. With `autocast_dtype=None` it equals `model.forward` (tested).

    bf16 matrix products are about 2.5× faster than float32 on CPUs with AVX512-BF16; the skip term needs float32
    (at low γ its logits reach ~100, where bf16 rounding alone would be ~0.5 nats).
    """
    backbone, config = model.backbone, model.config
    enabled = autocast_dtype is not None
    with torch.autocast(z.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=enabled):
        x = z.to(backbone.vocab_embed.embedding.dtype)
        if config.self_conditioning:
            sc = torch.zeros_like(x) if self_conditioning is None else self_conditioning.to(x.dtype)
            x = x + backbone.self_cond_proj(torch.cat([x, sc], dim=-1))
        c = F.silu(backbone.sigma_map(gamma))
        cos, sin = backbone.rotary_emb(x.shape[1], x.device)
        for block in backbone.blocks:
            x = block(x, cos, sin, c)
        logits = backbone.output_layer(x, c)
    logits = logits.float()
    if config.use_skip_logits:
        c_skip = ((F.softplus(-gamma) - gamma) / 2).exp()
        skip = z.float() @ model.embedding_matrix().t().float()
        logits = torch.addcmul(logits, c_skip[:, None, None], skip)
    return logits


def self_conditioned_logits(model, z, gamma, sc_mask: torch.Tensor | None, autocast_dtype=None):
    """
    Logits with the training self-conditioning scheme: where `sc_mask` is set, a no-grad pass with zero SC input
    gives x̂ = softmax(logits)·E_norm, which is fed (detached) to the returned pass; elsewhere the SC input is zero.
    """
    sc_input = None
    if sc_mask is not None and bool(sc_mask.any()):
        index = sc_mask.nonzero().squeeze(1)
        with torch.no_grad():
            first = forward_logits(model, z[index].detach(), gamma[index], None, autocast_dtype)
            sc_input = torch.zeros_like(z, dtype=torch.float32)
            sc_input[index] = model.clean_prediction(first).detach()
    return forward_logits(model, z, gamma, sc_input, autocast_dtype)


def token_cross_entropy(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-token CE (nats), `(batch, length)`."""
    flat = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="none")
    return flat.view(ids.shape)


@torch.no_grad()
def evaluate_per_gamma(
    model: LangFlowTransformerModel,
    windows: torch.Tensor,
    gammas=DEFAULT_EVAL_GAMMAS,
    batch_size: int = 32,
    seed: int = 0,
) -> list[dict]:
    """
    Held-out cross-entropy and token accuracy at fixed noise levels, without and with self-conditioning.

    For every γ, every window gets a noise draw (the same draw for both variants: the comparison is paired). "no SC"
    is one pass with zero SC input; "SC" feeds that pass's x̂ = softmax(logits)·E_norm into a second pass, as in
    training and in the sampler's first steps.

    Args:
        model: the network (evaluated as it is; pass the EMA weights for the exported model's numbers).
        windows (`torch.LongTensor` of shape `(n, length)`): token windows, e.g. from [`fixed_windows`].
        gammas: the noise levels γ = −log SNR.
        batch_size: windows per forward pass.
        seed: seed of the noise generator.

    Returns:
        `list[dict]`: one row per γ with `gamma`, `ce_no_sc`, `ce_sc`, `sc_gain` (nats), `acc_no_sc`, `acc_sc`.
    """
    was_training = model.training
    model.eval()
    device = model.device
    generator = torch.Generator().manual_seed(seed)  # on the CPU: the same draws whatever the model's device
    rows = []
    dim = model.config.hidden_size
    for gamma_value in gammas:
        totals = torch.zeros(4, dtype=torch.float64, device=device)
        count = 0
        for start in range(0, windows.shape[0], batch_size):
            ids = windows[start : start + batch_size].to(device)
            noise = torch.randn(ids.shape[0], ids.shape[1], dim, generator=generator).to(device)
            gamma = torch.full((ids.shape[0],), float(gamma_value), device=device)
            z = noisy_latents(model, ids, gamma, noise)
            plain = model(z, gamma).logits
            sc = model(z, gamma, model.clean_prediction(plain)).logits
            for slot, logits in ((0, plain), (1, sc)):
                totals[slot] += token_cross_entropy(logits, ids).double().sum()
                totals[slot + 2] += (logits.argmax(-1) == ids).double().sum()
            count += ids.numel()
        ce_plain, ce_sc, acc_plain, acc_sc = (totals / count).tolist()
        rows.append(
            {
                "gamma": float(gamma_value),
                "ce_no_sc": ce_plain,
                "ce_sc": ce_sc,
                "sc_gain": ce_plain - ce_sc,
                "acc_no_sc": acc_plain,
                "acc_sc": acc_sc,
            }
        )
    model.train(was_training)
    return rows


def format_gamma_table(rows: list[dict], unigram: float | None = None) -> str:
    """A markdown table of [`evaluate_per_gamma`] rows (γ across, metrics down)."""
    header = "| γ | " + " | ".join(f"{r['gamma']:g}" for r in rows) + " |"
    lines = [header, "|---" * (len(rows) + 1) + "|"]
    for key, label, fmt in (
        ("ce_no_sc", "CE, no SC", "{:.3f}"),
        ("ce_sc", "CE, SC", "{:.3f}"),
        ("sc_gain", "SC gain (nats)", "{:+.3f}"),
        ("acc_no_sc", "accuracy, no SC", "{:.3f}"),
        ("acc_sc", "accuracy, SC", "{:.3f}"),
    ):
        lines.append(f"| {label} | " + " | ".join(fmt.format(r[key]) for r in rows) + " |")
    if unigram is not None:
        lines.append(f"\nUnigram cross-entropy of these windows (train unigram): {unigram:.3f} nats.")
    return "\n".join(lines)


def lr_at(step: int, config: LangFlowTrainConfig, total_steps: int | None) -> float:
    """Learning rate for optimiser step `step` (1-based): linear warm-up, then cosine to `min_lr_ratio`·lr."""
    if step <= config.warmup_steps:
        return config.lr * step / max(1, config.warmup_steps)
    if total_steps is None:
        return config.lr
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    ratio = config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * ratio


def training_device(name: str, autocast: str = "none") -> torch.device:
    """
    The device a run trains on (`"cpu"` or `"cuda"`), refused with a clear error where torch sees no GPU; a warning
    where bf16 autocast would run on a CPU that emulates bfloat16 (about 50× slower, :mod:`untied_sc.hardware`).
    """
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r}, but this torch build sees no GPU: train with device='cpu'.")
    if device.type == "cpu" and autocast == "bf16":
        warn_if_emulated_bfloat16("Training (autocast='bf16')", "Train with --autocast none (float32) here.")
    return device


def latent_noise_generator(device: torch.device, seed: int) -> torch.Generator | None:
    """
    The generator of the latent noise ε off the CPU (seed·2 + 3), `None` on the CPU, where ε keeps coming from the
    noise generator. ε is the only large draw: on a GPU it is drawn there (a CPU draw would be slower than the step
    itself), so a GPU run is reproducible on GPUs but not bit for bit against a CPU run.
    """
    return None if device.type == "cpu" else torch.Generator(device).manual_seed(seed * 2 + 3)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class LangFlowTrainer:
    """
    Trains a [`LangFlowTransformerModel`] with the objective in the module docstring.

    Args:
        config: the run's settings.
        train_tokens / val_tokens (`torch.Tensor`, *optional*): 1-D token streams; by default the corpus splits
            tokenised with the tokenizer in `config.tokenizer_dir`.
        tokenizer (*optional*): the tokenizer (default: loaded from `config.tokenizer_dir`); copied into the run.
        vocab_size (`int`, *optional*): defaults to `len(tokenizer)`.
    """

    config_class = LangFlowTrainConfig
    # Set by __init__ (ELF's trainer, which shares the loop and the checkpoint code, sets them too).
    device = torch.device("cpu")
    latent_generator: torch.Generator | None = None

    def __init__(
        self, config: LangFlowTrainConfig, train_tokens=None, val_tokens=None, tokenizer=None, vocab_size=None
    ):
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.run_dir = Path(config.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if tokenizer is None and (train_tokens is None or vocab_size is None):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_dir)
        self.tokenizer = tokenizer
        if train_tokens is None:
            corpus = Path(config.corpus_dir)
            train_tokens = load_split_tokens(corpus / "train.txt", tokenizer, config.token_cache_dir)
            val_tokens = load_split_tokens(corpus / "validation.txt", tokenizer, config.token_cache_dir)
        self.train_tokens = train_tokens
        self.val_tokens = val_tokens if val_tokens is not None else train_tokens
        self.vocab_size = vocab_size or len(tokenizer)
        self.unigram_entropy = unigram_entropy(self.train_tokens, self.vocab_size)

        self.device = training_device(config.device, config.autocast)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)  # initialised on the CPU, so the initial weights do not depend on device
            self.model = LangFlowTransformerModel(**config.model_config(self.vocab_size))
        self.model.to(self.device)
        self.set_proposal(config.proposal_loc, config.proposal_scale)
        for parameter in self.model.proposal.parameters():
            parameter.requires_grad_(False)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self._parameter_groups(), lr=config.lr, betas=(config.beta1, config.beta2), eps=1e-8
        )
        self.ema = EMA(self.model, config.ema_decay, copy=("proposal.",))
        self.stats = ProposalStats()
        self.data_generator = torch.Generator().manual_seed(config.seed * 2 + 1)
        self.noise_generator = torch.Generator().manual_seed(config.seed * 2 + 2)
        self.latent_generator = latent_noise_generator(self.device, config.seed)
        self.step = 0
        self.total_steps = config.max_steps
        self.elapsed = 0.0
        self.tokens_seen = 0
        self.last_fit: dict | None = None
        self._step_times: list[float] = []
        self._session_first_step = 0
        self._stop = False
        self._eval_model: LangFlowTransformerModel | None = None

    # -- setup ------------------------------------------------------------------------------------------------

    def _parameter_groups(self):
        decay, no_decay = [], []
        for name, parameter in self.model.named_parameters():
            if not parameter.requires_grad:
                continue
            if parameter.ndim < 2 or name == "backbone.vocab_embed.embedding":
                no_decay.append(parameter)
            else:
                decay.append(parameter)
        return [
            {"params": decay, "weight_decay": self.config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    def set_proposal(self, loc: float, scale: float) -> None:
        """Writes the Gumbel proposal into the model (and so into what sampling uses)."""
        with torch.no_grad():
            self.model.proposal.loc.fill_(loc)
            self.model.proposal.scale.fill_(scale)
            self.model.proposal.entropy.fill_(gumbel_entropy(scale))

    @property
    def proposal(self) -> tuple[float, float]:
        return self.model.proposal.loc.item(), self.model.proposal.scale.item()

    # -- one step ---------------------------------------------------------------------------------------------

    def train_step(self) -> dict:
        config, model = self.config, self.model
        device = self.device
        ids = sample_windows(self.train_tokens, config.batch_size, config.seq_len, self.data_generator).to(device)
        loc, scale = self.proposal
        gamma_cpu = sample_gamma(config.batch_size, loc, scale, config.gumbel_cutoff, self.noise_generator)
        noise_shape = (ids.shape[0], ids.shape[1], config.hidden_size)
        if self.latent_generator is None:
            noise = torch.randn(noise_shape, generator=self.noise_generator)
        else:
            noise = torch.randn(noise_shape, generator=self.latent_generator, device=device)
        sc_mask = (torch.rand(config.batch_size, generator=self.noise_generator) < config.sc_prob).to(device)
        gamma = gamma_cpu.to(device)

        self.step += 1
        lr = lr_at(self.step, config, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        z = noisy_latents(model, ids, gamma, noise)
        autocast_dtype = {"bf16": torch.bfloat16, "none": None}[config.autocast]
        logits = self_conditioned_logits(model, z, gamma, sc_mask, autocast_dtype)
        per_example = token_cross_entropy(logits, ids).mean(dim=1)
        loss = per_example.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.ema.update(model, self.step)
        per_example = per_example.detach()
        self.stats.update(gamma_cpu, per_example.cpu())
        self.tokens_seen += ids.numel()
        self._maybe_refit_proposal()
        return {
            "loss": loss.item(),
            "loss_sc": per_example[sc_mask].sum().item(),
            "n_sc": int(sc_mask.sum()),
            "loss_no_sc": per_example[~sc_mask].sum().item(),
            "n_no_sc": int((~sc_mask).sum()),
            "grad_norm": float(grad_norm),
            "lr": lr,
        }

    def _maybe_refit_proposal(self) -> None:
        config = self.config
        if config.proposal != "fit" or self.step < config.proposal_start:
            return
        if (self.step - config.proposal_start) % config.proposal_every:
            return
        if self.total_steps is not None and self.step > config.proposal_freeze * self.total_steps:
            return
        gammas, losses = self.stats.curve(min_weight=2.0)
        if gammas.numel() < 8:
            return
        # The fit needs both ends of the curve: a plateau near H_unigram at high γ (otherwise the model has not yet
        # learned the marginal there and the fit would wrongly pull all noise to low γ) and near-zero loss at low γ.
        if losses.max().item() < 0.8 * self.unigram_entropy or losses.min().item() > 0.2 * self.unigram_entropy:
            return
        fit_loc, fit_scale, error = fit_gumbel_to_curve(gammas, losses, self.unigram_entropy)
        loc, scale = self.proposal
        loc = min(max(loc + max(-config.proposal_max_move, min(config.proposal_max_move, fit_loc - loc)), 1.0), 10.0)
        move = config.proposal_max_move / 2
        scale = min(max(scale + max(-move, min(move, fit_scale - scale)), 0.4), 2.5)
        self.set_proposal(loc, scale)
        self.last_fit = {"step": self.step, "fit_loc": fit_loc, "fit_scale": fit_scale, "rms": error}

    # -- evaluation -------------------------------------------------------------------------------------------

    def ema_model(self) -> LangFlowTransformerModel:
        """A model holding the current EMA weights (with the current proposal); one instance, refreshed per call."""
        if self._eval_model is None:
            with torch.random.fork_rng(devices=[]):
                self._eval_model = LangFlowTransformerModel(**_model_kwargs(self.model.config)).to(self.device)
        self.ema.copy_to(self._eval_model)
        return self._eval_model.eval()

    @torch.no_grad()
    def validation_losses(self, model: LangFlowTransformerModel | None = None) -> dict:
        """
        Validation CE under the current proposal (γ at the stratified quantiles (i + ½)/n, one per window), with and
        without self-conditioning, on fixed windows and noise; and at the fixed γ of `VALIDATION_GAMMAS`.
        """
        config = self.config
        model = model or self.ema_model()
        windows = fixed_windows(self.val_tokens, config.eval_windows, config.seq_len, seed=1234)
        generator = torch.Generator().manual_seed(4321)
        loc, scale = self.proposal
        u = (torch.arange(config.eval_windows, dtype=torch.float64) + 0.5) / config.eval_windows
        gamma_min, gamma_max = gumbel_range(loc, scale, config.gumbel_cutoff)
        gammas = (loc - scale * torch.log(-torch.log(u))).clamp(gamma_min, gamma_max).float()
        totals = [0.0, 0.0]
        for start in range(0, config.eval_windows, config.batch_size):
            ids = windows[start : start + config.batch_size].to(self.device)
            gamma = gammas[start : start + config.batch_size].to(self.device)
            noise = torch.randn(ids.shape[0], ids.shape[1], config.hidden_size, generator=generator).to(self.device)
            z = noisy_latents(model, ids, gamma, noise)
            plain = model(z, gamma).logits
            sc = model(z, gamma, model.clean_prediction(plain)).logits
            totals[0] += token_cross_entropy(plain, ids).sum().item()
            totals[1] += token_cross_entropy(sc, ids).sum().item()
        n = windows.numel()
        result = {"val_loss_no_sc": totals[0] / n, "val_loss_sc": totals[1] / n}
        # Fixed noise levels too: comparable across steps even while the proposal moves.
        for row in evaluate_per_gamma(model, windows[:32], VALIDATION_GAMMAS, config.batch_size, seed=4321):
            result[f"val_ce_g{row['gamma']:g}_no_sc"] = row["ce_no_sc"]
            result[f"val_ce_g{row['gamma']:g}_sc"] = row["ce_sc"]
        return result

    # -- checkpoints ------------------------------------------------------------------------------------------

    def _loop_state(self) -> dict:
        """What every trainer's checkpoint holds: config, weights, EMA, optimizer, generators and counters."""
        return {
            "config": dataclasses.asdict(self.config),
            "model_config": _model_kwargs(self.model.config),
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data_generator": self.data_generator.get_state(),
            "noise_generator": self.noise_generator.get_state(),
            "latent_generator": None if self.latent_generator is None else self.latent_generator.get_state(),
            "step": self.step,
            "total_steps": self.total_steps,
            "elapsed": self.elapsed,
            "tokens_seen": self.tokens_seen,
            "unigram_entropy": self.unigram_entropy,
        }

    def _load_loop_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"], device=self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.data_generator.set_state(state["data_generator"])
        self.noise_generator.set_state(state["noise_generator"])
        if (state.get("latent_generator") is None) != (self.latent_generator is None):
            raise ValueError(
                "This checkpoint was written on another kind of device than this run's "
                f"device={self.device.type!r}: resume it with the device it was trained on."
            )
        if self.latent_generator is not None:
            self.latent_generator.set_state(state["latent_generator"])
        self.step = state["step"]
        self.total_steps = self.config.max_steps or state["total_steps"]
        self.elapsed = state["elapsed"]
        self.tokens_seen = state["tokens_seen"]

    def state_dict(self) -> dict:
        return {**self._loop_state(), "proposal_stats": self.stats.state_dict(), "last_fit": self.last_fit}

    def load_state_dict(self, state: dict) -> None:
        self._load_loop_state(state)
        self.stats.load_state_dict(state["proposal_stats"])
        self.last_fit = state["last_fit"]

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        path = Path(path) if path is not None else self.run_dir / CHECKPOINT
        _atomic_save(self.state_dict(), path)
        return path

    def save_snapshot(self) -> Path:
        """EMA weights only (a few MB), `ema-step<N>.pt`, for looking at the model along training."""
        path = self.run_dir / f"ema-step{self.step:06d}.pt"
        _atomic_save(
            {"model_config": _model_kwargs(self.model.config), "ema": self.ema.shadow, "step": self.step}, path
        )
        return path

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, overrides: dict | None = None, **kwargs) -> "LangFlowTrainer":
        """Rebuilds a trainer from a checkpoint (the saved config, with `overrides` of `RESUME_OVERRIDABLE`)."""
        state = torch.load(path, weights_only=False, map_location="cpu")
        saved = dict(state["config"])
        for key, value in (overrides or {}).items():
            if key not in RESUME_OVERRIDABLE:
                raise ValueError(f"`{key}` cannot change on resume (only {', '.join(RESUME_OVERRIDABLE)}).")
            saved[key] = value
        trainer = cls(cls.config_class(**saved), **cls._restored_kwargs(state), **kwargs)
        trainer.load_state_dict(state)
        return trainer

    @classmethod
    def _restored_kwargs(cls, state: dict) -> dict:
        """Constructor arguments a resumed trainer takes from its checkpoint besides the config (none here)."""
        return {}

    def describe(self) -> str:
        """The first log line of a new run."""
        parameters = sum(p.numel() for p in self.model.parameters())
        return (
            f"model {parameters / 1e6:.2f}M parameters; train {self.train_tokens.numel():,} tokens, validation "
            f"{self.val_tokens.numel():,}; unigram entropy {self.unigram_entropy:.3f} nats"
        )

    # -- the loop ---------------------------------------------------------------------------------------------

    def _truncate_log(self) -> None:
        """Drops log rows written after the checkpoint being resumed (they will be recomputed)."""
        log_path = self.run_dir / LOG
        if not log_path.exists():
            return
        rows = [line for line in log_path.read_text().splitlines() if line.strip()]
        kept = [line for line in rows if json.loads(line).get("step", 0) <= self.step]
        log_path.write_text("".join(line + "\n" for line in kept))

    def _write_log(self, row: dict) -> None:
        with open(self.run_dir / LOG, "a") as handle:
            handle.write(json.dumps(row) + "\n")

    def _calibrate_total_steps(self, step_seconds: float) -> None:
        """
        Without `max_steps`: fix the step count that fits the wall-clock budget from the median step time (robust to
        other processes briefly sharing the cores), first after 30 steps of the session, then again every 100 steps
        until a third of the run, so the cosine schedule ends with the budget. With `max_steps` nothing changes.
        """
        config = self.config
        self._step_times.append(step_seconds)
        del self._step_times[:-100]
        if config.max_steps is not None or config.budget_minutes is None:
            return
        session_steps = self.step - self._session_first_step
        if self.total_steps is None:
            due = session_steps >= 30
        else:
            due = self.step < self.total_steps / 3 and (
                session_steps == 30 or (session_steps > 30 and self.step % 100 == 0)
            )
        if not due:
            return
        per_step = sorted(self._step_times)[len(self._step_times) // 2]
        per_step *= 1.0 + 4.0 / max(1, config.eval_every)  # the periodic evaluations
        remaining = config.budget_minutes * 60 - self.elapsed
        total = max(self.step + 1, self.step + int(0.97 * remaining / per_step))
        if total != self.total_steps:
            self._log_message(f"median {per_step:.2f} s/step: {total} steps fit the budget")
        self.total_steps = total

    def _log_message(self, message: str) -> None:
        print(f"[train {time.strftime('%H:%M:%S')} step {self.step}] {message}", file=sys.stderr, flush=True)

    def _handle_signal(self, signum, frame) -> None:
        self._log_message(f"signal {signum}: checkpointing and stopping")
        self._stop = True

    def train(self, stop_at_step: int | None = None) -> dict:
        """Runs until `total_steps`, the wall-clock budget or SIGTERM/SIGINT; checkpoints on the way and at the end.

        `stop_at_step` stops early at that step (as a signal would) without changing the schedule, which still runs to
        `total_steps`: e.g. to retrain a prefix of a run and compare its log (benchmarks/retrain_prefix.py).
        """
        from tqdm.auto import tqdm

        config = self.config
        if config.max_steps is None and config.budget_minutes is None:
            raise ValueError("Give max_steps or budget_minutes.")
        (self.run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")
        if self.tokenizer is not None and not (self.run_dir / "tokenizer").exists():
            self.tokenizer.save_pretrained(self.run_dir / "tokenizer")
        self._truncate_log()
        previous = {}
        if threading_is_main():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._handle_signal)
        session_start = time.monotonic()
        elapsed_start = self.elapsed
        self._session_first_step, self._step_times = self.step, []
        last_checkpoint = last_snapshot = session_start
        window: dict[str, float] = {}
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not config.progress, dynamic_ncols=True)
        reason = "max_steps"
        try:
            while self.total_steps is None or self.step < self.total_steps:
                if self._stop:
                    reason = "signal"
                    break
                if stop_at_step is not None and self.step >= stop_at_step:
                    reason = "stop_at_step"
                    break
                if config.budget_minutes is not None and self.elapsed >= config.budget_minutes * 60:
                    reason = "budget"
                    break
                before = time.monotonic()
                metrics = self.train_step()
                now = time.monotonic()
                self.elapsed = elapsed_start + (now - session_start)
                self._calibrate_total_steps(now - before)
                if bar.total != self.total_steps:
                    bar.total = self.total_steps
                    bar.refresh()
                for key, value in metrics.items():
                    window[key] = window.get(key, 0.0) + value
                window["steps"] = window.get("steps", 0) + 1
                bar.update(1)
                if self.step % config.log_every == 0:
                    row = self._log_row(window)
                    if config.eval_every and self.step % config.eval_every == 0:
                        row.update(self.validation_losses())
                    self._write_log(row)
                    loc, scale = self.proposal
                    bar.set_postfix(loss=f"{row['loss']:.3f}", loc=f"{loc:.2f}", scale=f"{scale:.2f}")
                    window = {}
                if now - last_checkpoint >= config.checkpoint_minutes * 60:
                    self.save_checkpoint()
                    last_checkpoint = now
                if config.snapshot_minutes and now - last_snapshot >= config.snapshot_minutes * 60:
                    self.save_snapshot()
                    last_snapshot = now
        finally:
            bar.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.save_checkpoint()
        done = self.total_steps is not None and self.step >= self.total_steps
        self._log_message(f"stopped ({'done' if done else reason}); checkpoint {self.run_dir / CHECKPOINT}")
        return {"step": self.step, "done": done, "reason": "done" if done else reason, "elapsed": self.elapsed}

    def _log_row(self, window: dict) -> dict:
        loc, scale = self.proposal
        steps = window["steps"]
        return {
            "step": self.step,
            "tokens": self.tokens_seen,
            "elapsed_s": round(self.elapsed, 2),
            "loss": window["loss"] / steps,
            "loss_sc": window["loss_sc"] / max(1, window["n_sc"]),
            "loss_no_sc": window["loss_no_sc"] / max(1, window["n_no_sc"]),
            "grad_norm": window["grad_norm"] / steps,
            "lr": window["lr"] / steps,
            "proposal_loc": loc,
            "proposal_scale": scale,
            "total_steps": self.total_steps,
        }


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ---------------------------------------------------------------------------------------------------------------
# Export and evaluation of a run


def load_run_model(
    run_dir: str | os.PathLike, checkpoint: str | None = None, ema: bool = True, model_class=LangFlowTransformerModel
):
    """The model of a run's checkpoint or EMA snapshot (EMA weights by default) and the run's saved state.

    A snapshot holds weights only; its state gets the run's `config` from `<run_dir>/config.json`, and its token
    count, training time and step total from the log row of its step (when the log has one).
    """
    path = Path(checkpoint) if checkpoint else Path(run_dir) / CHECKPOINT
    state = torch.load(path, weights_only=False, map_location="cpu")
    if "config" not in state:
        state["config"] = json.loads((Path(run_dir) / "config.json").read_text())
        log_path = Path(run_dir) / LOG
        rows = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
        row = next((row for row in rows if row.get("step") == state.get("step") and "tokens" in row), None)
        if row is not None:
            state.update(tokens_seen=row["tokens"], elapsed=row["elapsed_s"], total_steps=row.get("total_steps"))
    model = model_class(**_model_kwargs(state["model_config"]))
    if ema:
        shadow = state["ema"]["shadow"] if "shadow" in state["ema"] else state["ema"]  # checkpoint or snapshot
        with torch.no_grad():
            model_state = model.state_dict()
            for name, value in shadow.items():
                model_state[name].copy_(value)
    else:
        model.load_state_dict(state["model"])
    return model.eval(), state


def _portable_tokenizer_files(folder: Path) -> None:
    """Names the tokenizer class `PreTrainedTokenizerFast` (loadable by transformers 4.x and 5.x)."""
    config_path = folder / "tokenizer_config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def export_pipeline(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    checkpoint: str | None = None,
    dtype: str = "float32",
    tokenizer_dir: str | os.PathLike | None = None,
) -> Path:
    """
    Writes `LangFlowPipeline(EMA transformer, LangFlowScheduler(proposal=its proposal), tokenizer)
    .save_pretrained(out_dir)` plus `training_info.json` (config, steps, tokens, proposal, last logged losses).
    """
    from transformers import AutoTokenizer

    from ..pipelines import LangFlowPipeline

    run = Path(run_dir)
    model, state = load_run_model(run, checkpoint)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    tokenizer_path = Path(tokenizer_dir) if tokenizer_dir else run / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    out = Path(out_dir)
    scheduler = LangFlowScheduler(proposal=list(model.gumbel_parameters()))  # a bare `set_timesteps(N)` works
    pipeline = LangFlowPipeline(transformer=model, scheduler=scheduler, tokenizer=tokenizer)
    pipeline.save_pretrained(out)
    _portable_tokenizer_files(out / "tokenizer")
    index_path = out / "model_index.json"
    index = json.loads(index_path.read_text())
    if index.get("tokenizer", [None])[0] == "transformers":
        index["tokenizer"] = ["transformers", "PreTrainedTokenizerFast"]
        index_path.write_text(json.dumps(index, indent=2) + "\n")
    last_rows = []
    log_path = run / LOG
    if log_path.exists():
        last_rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()][-5:]
    parameters = sum(p.numel() for p in model.parameters())
    info = {
        "step": state.get("step"),
        "total_steps": state.get("total_steps"),
        "tokens_seen": state.get("tokens_seen"),
        "train_seconds": state.get("elapsed"),
        "parameters": parameters,
        "dtype": dtype,
        "proposal": {"loc": model.proposal.loc.item(), "scale": model.proposal.scale.item()},
        "unigram_entropy": state.get("unigram_entropy"),
        "config": state["config"],
        "last_log_rows": last_rows,
    }
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Command line


def start_or_resume(trainer_class, given: dict, resume: bool):
    """A trainer for the CLI: resumed from the run's checkpoint (only `RESUME_OVERRIDABLE` settings may change) or
    new (refusing to overwrite an existing run)."""
    if resume:
        run_dir = Path(given.get("run_dir", trainer_class.config_class.run_dir))
        checkpoint = run_dir / CHECKPOINT
        if not checkpoint.exists():
            raise FileNotFoundError(f"No checkpoint to resume at {checkpoint}.")
        overrides = {key: value for key, value in given.items() if key in RESUME_OVERRIDABLE}
        ignored = sorted(set(given) - set(overrides) - {"run_dir"})
        if ignored:
            print(f"--resume: using the saved settings for {', '.join(ignored)}", file=sys.stderr)
        trainer = trainer_class.from_checkpoint(checkpoint, overrides)
        trainer._log_message(f"resumed from {checkpoint} at step {trainer.step}")
        return trainer
    config = trainer_class.config_class(**given)
    if (Path(config.run_dir) / CHECKPOINT).exists():
        raise FileExistsError(f"{config.run_dir} already has a checkpoint: pass --resume, or another --run-dir.")
    trainer = trainer_class(config)
    trainer._log_message(trainer.describe())
    return trainer


def _train(args: argparse.Namespace) -> None:
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(LangFlowTrainConfig)
        if getattr(args, f.name, None) is not None
    }
    if args.no_progress:
        given["progress"] = False
    result = start_or_resume(LangFlowTrainer, given, args.resume).train()
    print(json.dumps(result))


def _export(args: argparse.Namespace) -> None:
    out = export_pipeline(args.run_dir, args.out, args.checkpoint, args.dtype)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({size / 2**20:.1f} MiB)")


def _evaluate(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    if args.pipeline:
        from ..pipelines import LangFlowPipeline

        pipeline = LangFlowPipeline.from_pretrained(args.pipeline)
        model, tokenizer = pipeline.transformer.float().eval(), pipeline.tokenizer
    else:
        model, _ = load_run_model(args.run_dir, args.checkpoint)
        tokenizer = AutoTokenizer.from_pretrained(Path(args.run_dir) / "tokenizer")
    corpus = Path(args.corpus_dir)
    tokens = load_split_tokens(corpus / f"{args.split}.txt", tokenizer, args.token_cache_dir)
    train_tokens = load_split_tokens(corpus / "train.txt", tokenizer, args.token_cache_dir)
    windows = fixed_windows(tokens, args.windows, model.config.max_length, seed=args.seed)
    gammas = [float(g) for g in args.gammas.split(",")] if args.gammas else DEFAULT_EVAL_GAMMAS
    rows = evaluate_per_gamma(model, windows, gammas, seed=args.seed)
    unigram = unigram_entropy(windows, model.config.vocab_size, reference=train_tokens)
    print(format_gamma_table(rows, unigram))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "unigram_cross_entropy": unigram}, indent=2) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The `python -m untied_sc.training.langflow` parser (built by the light `untied_sc.training.cli`)."""
    from .cli import build_parser as build_family_parser

    return build_family_parser("langflow")


def main(argv: list[str] | None = None) -> int:
    from .cli import main as family_main

    return family_main("langflow", argv)


if __name__ == "__main__":
    sys.exit(main())
