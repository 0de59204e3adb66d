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
(:mod:`untied_sc_lab.training.proposal`): the training noise concentrates where the loss changes with γ, i.e. where
there is something to learn, and the sampler's grid (the proposal's quantiles) spends its steps there too. Each
refit moves loc by at most `proposal_max_move` (scale by half that), and refits stop after `proposal_freeze` of
the run, so the last part trains on exactly the proposal that is saved. `proposal="fixed"` keeps the initial
`proposal_loc/scale`.

Run `python -m untied_sc_lab.training.langflow train --help`.
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from untied_sc.models import LangFlowTransformerModel
from untied_sc.pipelines import LangFlowPipeline
from untied_sc.schedulers import LangFlowScheduler

from .cli import build_parser as build_family_parser
from .cli import main as family_main
from .config import LangFlowTrainConfig
from .data import fixed_windows, load_split_tokens, sample_windows, unigram_entropy
from .proposal import ProposalStats, fit_gumbel_to_curve, gumbel_entropy, gumbel_range, sample_gamma
from .trainer import (
    FlowTrainer,
    load_run,
    model_to_evaluate,
    print_export,
    save_portable_pipeline,
    train_from_command_line,
    write_training_info,
)


VALIDATION_GAMMAS = (3.0, 4.0, 5.0)
DEFAULT_EVAL_GAMMAS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 12.0)


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


class LangFlowTrainer(FlowTrainer):
    """
    Trains a [`LangFlowTransformerModel`] with the objective in the module docstring; the loop, optimisation,
    checkpoints and log are [`FlowTrainer`]'s.

    Args:
        config: the run's settings.
        train_tokens / val_tokens (`torch.Tensor`, *optional*): 1-D token streams; by default the corpus splits
            tokenised with the tokenizer in `config.tokenizer_dir`.
        tokenizer (*optional*): the tokenizer (default: loaded from `config.tokenizer_dir`); copied into the run.
        vocab_size (`int`, *optional*): defaults to `len(tokenizer)`.
    """

    config_class = LangFlowTrainConfig
    model_class = LangFlowTransformerModel
    loss_parts = (("loss_sc", "n_sc"), ("loss_no_sc", "n_no_sc"))

    def __init__(
        self, config: LangFlowTrainConfig, train_tokens=None, val_tokens=None, tokenizer=None, vocab_size=None
    ):
        self._start_run(config)
        if tokenizer is None and (train_tokens is None or vocab_size is None):
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

        self._init_model(**config.model_config(self.vocab_size))
        self.set_proposal(config.proposal_loc, config.proposal_scale)
        for parameter in self.model.proposal.parameters():
            parameter.requires_grad_(False)
        # The proposal is set, not trained: the EMA model (evaluation, export) carries the current one.
        self._init_loop(ema_copy=("proposal.",))
        self.stats = ProposalStats()
        self.last_fit: dict | None = None

    # -- setup ------------------------------------------------------------------------------------------------

    def _no_weight_decay(self, name: str, parameter: torch.nn.Parameter) -> bool:
        return super()._no_weight_decay(name, parameter) or name == "backbone.vocab_embed.embedding"

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

        lr = self._next_step()
        z = noisy_latents(model, ids, gamma, noise)
        logits = self_conditioned_logits(model, z, gamma, sc_mask, self.autocast_dtype)
        per_example = token_cross_entropy(logits, ids).mean(dim=1)
        loss = per_example.mean()
        grad_norm = self._apply_gradients(loss)
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
            "grad_norm": grad_norm,
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

    def state_dict(self) -> dict:
        return {**super().state_dict(), "proposal_stats": self.stats.state_dict(), "last_fit": self.last_fit}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.stats.load_state_dict(state["proposal_stats"])
        self.last_fit = state["last_fit"]

    def describe(self) -> str:
        parameters = sum(p.numel() for p in self.model.parameters())
        return (
            f"model {parameters / 1e6:.2f}M parameters; train {self.train_tokens.numel():,} tokens, validation "
            f"{self.val_tokens.numel():,}; unigram entropy {self.unigram_entropy:.3f} nats"
        )

    def _log_extras(self) -> dict:
        loc, scale = self.proposal
        return {"proposal_loc": loc, "proposal_scale": scale}


# ---------------------------------------------------------------------------------------------------------------
# Export and evaluation of a run


def load_run_model(run_dir: str | os.PathLike, checkpoint: str | None = None, ema: bool = True):
    """The LangFlow model of a run's checkpoint or EMA snapshot (EMA weights by default) and the run's saved state
    ([`load_run`])."""
    return load_run(run_dir, checkpoint, ema, LangFlowTransformerModel)


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

    run = Path(run_dir)
    model, state = load_run_model(run, checkpoint)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    tokenizer_path = Path(tokenizer_dir) if tokenizer_dir else run / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    out = Path(out_dir)
    scheduler = LangFlowScheduler(proposal=list(model.gumbel_parameters()))  # a bare `set_timesteps(N)` works
    pipeline = LangFlowPipeline(transformer=model, scheduler=scheduler, tokenizer=tokenizer)
    save_portable_pipeline(pipeline, out)
    proposal = {"loc": model.proposal.loc.item(), "scale": model.proposal.scale.item()}
    write_training_info(out, run, state, model, dtype, proposal=proposal)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Command line


def _train(args: argparse.Namespace) -> None:
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(LangFlowTrainConfig)
        if getattr(args, f.name, None) is not None
    }
    train_from_command_line(LangFlowTrainer, given, args.resume, progress=not args.no_progress)


def _export(args: argparse.Namespace) -> None:
    print_export(export_pipeline(args.run_dir, args.out, args.checkpoint, args.dtype))


def _evaluate(args: argparse.Namespace) -> None:

    model, tokenizer, _ = model_to_evaluate(args, LangFlowPipeline, load_run_model)
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
    """The `python -m untied_sc_lab.training.langflow` parser (built by the light `untied_sc_lab.training.cli`)."""

    return build_family_parser("langflow")


def main(argv: list[str] | None = None) -> int:

    return family_main("langflow", argv)


if __name__ == "__main__":
    sys.exit(main())
