"""What the LangFlow and ELF trainers share: the loop, the optimisation, the checkpoints and the export's bookkeeping.

[`FlowTrainer`] holds one copy of

* the optimisation: AdamW (no decay on biases, norms and the family's embeddings), linear warm-up then cosine decay
  ([`lr_at`]), gradient clipping and an EMA of the weights (what gets exported);
* the run's generators (data and noise on the CPU, seeded from `config.seed`; ε's own off the CPU,
  [`latent_noise_generator`]) and its counters;
* the loop ([`FlowTrainer.train`]): wall-clock budget (the step count fitted to it), SIGTERM/SIGINT, the JSONL log,
  periodic checkpoints and EMA snapshots, a checkpoint at the end;
* checkpoints and resume ([`start_or_resume`]), and what the exports share ([`load_run`],
  [`save_portable_pipeline`], [`write_training_info`]).

A family's trainer (`langflow.py`, `elf.py`) subclasses it with its data, its model, its objective (noising through
its scheduler's `add_noise`, loss, self-conditioning) in `train_step`, its validation and the state it adds to the
checkpoint.
"""

import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from untied_sc.hardware import warn_if_emulated_bfloat16

from .config import TrainConfig
from .ema import EMA


CHECKPOINT = "checkpoint.pt"
LOG = "loss_log.jsonl"
# Options that may differ on `--resume` without changing what the run computes (or, for the step limits, only
# where it ends).
RESUME_OVERRIDABLE = ("budget_minutes", "max_steps", "checkpoint_minutes", "snapshot_minutes", "threads", "progress")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "none": None}


def model_kwargs(config) -> dict:
    """The constructor arguments in a model config (without diffusers' private `_*` entries)."""
    return {key: value for key, value in dict(config).items() if not key.startswith("_")}


def lr_at(step: int, config: TrainConfig, total_steps: int | None) -> float:
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


def _threading_is_main() -> bool:
    return threading.current_thread() is threading.main_thread()


class FlowTrainer:
    """
    The loop, optimisation, checkpoints and log of a training run; a family's trainer adds its data, model, objective
    (`train_step`), validation and checkpoint state.

    A subclass's `__init__` calls [`_start_run`], sets its data, `tokenizer` (saved in the run, or `None`) and
    `unigram_entropy`, then [`_init_model`] and [`_init_loop`]. It defines `train_step` (built on [`_next_step`] and
    [`_apply_gradients`]), `validation_losses`, `proposal` (shown on the progress bar) and `describe`, and names in
    `loss_parts` the per-example loss means its log rows carry.
    """

    config_class: type[TrainConfig]
    model_class: type[torch.nn.Module]
    # (log key, count key) of each per-example loss mean in the log: `train_step` returns the sum and the count.
    loss_parts: tuple[tuple[str, str], ...] = ()
    # Set by `_start_run` and `_init_loop`.
    device = torch.device("cpu")
    latent_generator: torch.Generator | None = None

    # -- setup ------------------------------------------------------------------------------------------------

    def _start_run(self, config: TrainConfig) -> None:
        """The device (refused before anything is written or loaded), the thread count and the run folder."""
        self.config = config
        self.device = training_device(config.device, config.autocast)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.run_dir = Path(config.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _init_model(self, **kwargs) -> None:
        """`model_class(**kwargs)` seeded with `config.seed`, on the device."""
        # Initialised on the CPU, so the initial weights do not depend on the device.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            self.model = self.model_class(**kwargs)
        self.model.to(self.device)

    def _init_loop(self, ema_copy: tuple[str, ...] = ()) -> None:
        """The optimiser, the EMA (`ema_copy`: prefixes copied, not averaged), the generators and the counters, once
        the model is built (and what it does not train is frozen)."""
        config = self.config
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self._parameter_groups(), lr=config.lr, betas=(config.beta1, config.beta2), eps=1e-8
        )
        self.ema = EMA(self.model, config.ema_decay, copy=ema_copy)
        self.data_generator = torch.Generator().manual_seed(config.seed * 2 + 1)
        self.noise_generator = torch.Generator().manual_seed(config.seed * 2 + 2)
        self.latent_generator = latent_noise_generator(self.device, config.seed)
        self.step = 0
        self.total_steps = config.max_steps
        self.elapsed = 0.0
        self.tokens_seen = 0
        self._step_times: list[float] = []
        self._session_first_step = 0
        self._stop = False
        self._eval_model: torch.nn.Module | None = None

    def _no_weight_decay(self, name: str, parameter: torch.nn.Parameter) -> bool:
        """Biases and norms take no weight decay (a family adds its embeddings)."""
        return parameter.ndim < 2

    def _parameter_groups(self) -> list[dict]:
        decay, no_decay = [], []
        for name, parameter in self.model.named_parameters():
            if not parameter.requires_grad:
                continue
            (no_decay if self._no_weight_decay(name, parameter) else decay).append(parameter)
        return [
            {"params": decay, "weight_decay": self.config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    # -- one step ---------------------------------------------------------------------------------------------

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The network's autocast dtype (`None`: float32)."""
        return AUTOCAST_DTYPES[self.config.autocast]

    def _next_step(self) -> float:
        """Counts the optimiser step about to be taken and sets its learning rate (returned)."""
        self.step += 1
        lr = lr_at(self.step, self.config, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _apply_gradients(self, loss: torch.Tensor) -> float:
        """Backward, gradient clipping, the AdamW step and the EMA update; returns the norm before clipping."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.ema.update(self.model, self.step)
        return float(grad_norm)

    def train_step(self) -> dict:
        """One optimiser step; returns `loss`, `grad_norm`, `lr` and the sums and counts named in `loss_parts`."""
        raise NotImplementedError

    # -- evaluation -------------------------------------------------------------------------------------------

    def ema_model(self) -> torch.nn.Module:
        """A model holding the current EMA weights; one instance, refreshed per call."""
        if self._eval_model is None:
            with torch.random.fork_rng(devices=[]):
                self._eval_model = self.model_class(**model_kwargs(self.model.config)).to(self.device)
        self.ema.copy_to(self._eval_model)
        return self._eval_model.eval()

    def validation_losses(self, model: torch.nn.Module | None = None) -> dict:
        """The validation numbers of a log row (of the EMA model by default)."""
        raise NotImplementedError

    @property
    def proposal(self) -> tuple[float, float]:
        """The noise-level distribution's (loc, scale), shown on the progress bar."""
        raise NotImplementedError

    def describe(self) -> str:
        """The first log line of a new run."""
        raise NotImplementedError

    # -- checkpoints ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What every trainer's checkpoint holds: config, weights, EMA, optimizer, generators and counters."""
        return {
            "config": dataclasses.asdict(self.config),
            "model_config": model_kwargs(self.model.config),
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

    def load_state_dict(self, state: dict) -> None:
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

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        path = Path(path) if path is not None else self.run_dir / CHECKPOINT
        _atomic_save(self.state_dict(), path)
        return path

    def save_snapshot(self) -> Path:
        """EMA weights only (a few MB), `ema-step<N>.pt`, for looking at the model along training."""
        path = self.run_dir / f"ema-step{self.step:06d}.pt"
        _atomic_save(
            {"model_config": model_kwargs(self.model.config), "ema": self.ema.shadow, "step": self.step}, path
        )
        return path

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, overrides: dict | None = None, **kwargs) -> "FlowTrainer":
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

        config = self.config
        if config.max_steps is None and config.budget_minutes is None:
            raise ValueError("Give max_steps or budget_minutes.")
        (self.run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")
        if self.tokenizer is not None and not (self.run_dir / "tokenizer").exists():
            self.tokenizer.save_pretrained(self.run_dir / "tokenizer")
        self._truncate_log()
        previous = {}
        if _threading_is_main():
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

    def _log_extras(self) -> dict:
        """What a family adds to a log row after the learning rate (none here)."""
        return {}

    def _log_row(self, window: dict) -> dict:
        """A log row of the steps summed in `window`: means per step, and per example for `loss_parts`."""
        steps = window["steps"]
        return {
            "step": self.step,
            "tokens": self.tokens_seen,
            "elapsed_s": round(self.elapsed, 2),
            "loss": window["loss"] / steps,
            **{key: window[key] / max(1, window[count]) for key, count in self.loss_parts},
            "grad_norm": window["grad_norm"] / steps,
            "lr": window["lr"] / steps,
            **self._log_extras(),
            "total_steps": self.total_steps,
        }


# ---------------------------------------------------------------------------------------------------------------
# Export and evaluation of a run


def load_run(run_dir: str | os.PathLike, checkpoint: str | None, ema: bool, model_class):
    """A `model_class` model from a run's checkpoint or EMA snapshot (EMA weights with `ema`), and the run's state.

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
    model = model_class(**model_kwargs(state["model_config"]))
    if ema:
        shadow = state["ema"]["shadow"] if "shadow" in state["ema"] else state["ema"]  # checkpoint or snapshot
        with torch.no_grad():
            model_state = model.state_dict()
            for name, value in shadow.items():
                model_state[name].copy_(value)
    else:
        model.load_state_dict(state["model"])
    return model.eval(), state


def save_portable_pipeline(pipeline, out: Path) -> None:
    """`pipeline.save_pretrained(out)`, with its tokenizer named `PreTrainedTokenizerFast` (in the tokenizer's
    config and in `model_index.json`), so that transformers 4.x and 5.x both load it."""
    pipeline.save_pretrained(out)
    config_path = out / "tokenizer" / "tokenizer_config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    index_path = out / "model_index.json"
    index = json.loads(index_path.read_text())
    if index.get("tokenizer", [None])[0] == "transformers":
        index["tokenizer"] = ["transformers", "PreTrainedTokenizerFast"]
        index_path.write_text(json.dumps(index, indent=2) + "\n")


def write_training_info(out: Path, run: Path, state: dict, model: torch.nn.Module, dtype: str, **family) -> None:
    """`<out>/training_info.json`: the run's steps, tokens, time, size, `dtype`, the `family` entries (e.g. the
    proposal), config and last five log rows."""
    last_rows = []
    log_path = run / LOG
    if log_path.exists():
        last_rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()][-5:]
    info = {
        "step": state.get("step"),
        "total_steps": state.get("total_steps"),
        "tokens_seen": state.get("tokens_seen"),
        "train_seconds": state.get("elapsed"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
        **family,
        "unigram_entropy": state.get("unigram_entropy"),
        "config": state["config"],
        "last_log_rows": last_rows,
    }
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Command line


def print_export(out: Path) -> None:
    """The `export` action's report: the folder written and its size."""
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({size / 2**20:.1f} MiB)")


def model_to_evaluate(args, pipeline_class, load_run_model) -> tuple:
    """
    The `evaluate` action's `(model, tokenizer, state)`: an exported `pipeline_class` folder's (`args.pipeline`;
    `state` is `None`), or else a run's model and saved state by `load_run_model` (EMA weights) and its tokenizer.
    """
    if args.pipeline:
        pipeline = pipeline_class.from_pretrained(args.pipeline)
        return pipeline.transformer.float().eval(), pipeline.tokenizer, None

    model, state = load_run_model(args.run_dir, args.checkpoint)
    return model, AutoTokenizer.from_pretrained(Path(args.run_dir) / "tokenizer"), state


def start_or_resume(trainer_class: type[FlowTrainer], given: dict, resume: bool) -> FlowTrainer:
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


def train_from_command_line(trainer_class: type[FlowTrainer], given: dict, resume: bool, progress: bool) -> None:
    """The `train` action: starts or resumes the run with the `given` settings and prints its result as JSON."""
    if not progress:
        given = {**given, "progress": False}
    result = start_or_resume(trainer_class, given, resume).train()
    print(json.dumps(result))
