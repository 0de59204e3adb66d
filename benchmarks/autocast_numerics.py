"""How much bf16 autocast (`pipe.enable_autocast`) changes a pipeline's network outputs and its tokens vs float32.

    nice -n 10 python benchmarks/autocast_numerics.py hub_artifacts/langflow-small --nfe 8 --batch-size 4
    nice -n 10 python benchmarks/autocast_numerics.py hub_artifacts/elf-small --nfe 8 --batch-size 4
    python benchmarks/autocast_numerics.py --official-elf-src ELF/src --official-langflow-src LangFlow

1. Network: along the float32 trajectory of seed `--seed`, each step's network call is repeated with autocast on the
   same inputs (latent, time, self-conditioning): max |Δ| and max |Δ| / max |float32| of the clean prediction and of
   the logits (LangFlow: every step's; ELF: the decode pass on the final latents), and the share of positions whose
   logits' argmax agrees.
2. Sampler: the same pipeline call (seed, NFE, batch) in float32 and with autocast: the share of equal token ids.

With `--official-*-src` (checkouts of the official code; the ELF port needs `einops`), instead: our networks with
`enable_autocast(torch.bfloat16)` against the official networks under bf16 autocast on the CPU, on the golden fixtures'
weights and inputs (`tests/fixtures/*_forward.safetensors`). The official code autocasts on 'cuda' only, so its
`torch.autocast` / `torch.amp.autocast` calls are mapped to the CPU here (its `enabled=False` regions included).

Prints JSON and writes nothing. On a CPU without native bfloat16, bf16 is emulated (slow; small models only).
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]


def _diff(ours: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    delta = (ours.float() - reference.float()).abs().max().item()
    return {"max_abs": delta, "max_rel": delta / reference.float().abs().max().item()}


def _worst(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: max(row[key] for row in rows) for key in rows[0]}


def network_and_tokens(folder: str, nfe: int, batch_size: int, seed: int, dtype: torch.dtype) -> dict:
    from untied_sc.pipelines import load_pipeline

    pipe = load_pipeline(folder)
    pipe.set_progress_bar_config(disable=True)
    steps = []

    def compare(step):
        pipe.enable_autocast(dtype)
        try:
            prediction, logits = pipe._predict(step.model_input, step.timestep, step.self_conditioning)
        finally:
            pipe.disable_autocast()
        row = {"prediction": _diff(prediction, step.prediction)}
        if logits is not None:
            row["logits"] = _diff(logits, step.logits)
            row["argmax_agreement"] = (logits.argmax(-1) == step.logits.argmax(-1)).float().mean().item()
        steps.append(row)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated-bf16 warning: known here
        started = time.perf_counter()
        final = pipe.denoise(batch_size, nfe, torch.Generator().manual_seed(seed), step_callback=compare)
        result = {"folder": folder, "family": pipe.family, "nfe": nfe, "batch_size": batch_size, "seed": seed}
        if pipe.family == "elf":  # the tokens come from the decode pass on the final latents
            reference = pipe.transformer(final.latents, 1.0, None, pipe.sc_cfg_scale, decoder_step_active=True)
            pipe.enable_autocast(dtype)
            ours = pipe.transformer(final.latents, 1.0, None, pipe.sc_cfg_scale, decoder_step_active=True)
            pipe.disable_autocast()
            result["decode_logits"] = _diff(ours.logits, reference.logits)
            agreement = ours.logits.argmax(-1) == reference.logits.argmax(-1)
            result["decode_argmax_agreement"] = agreement.float().mean().item()
        result["per_step"] = steps
        result["worst_step"] = {
            key: _worst([row[key] for row in steps]) for key in steps[0] if isinstance(steps[0][key], dict)
        }
        call = {"batch_size": batch_size, "num_inference_steps": nfe, "output_type": "seq"}
        float32 = pipe(generator=torch.Generator().manual_seed(seed), **call).sequences
        pipe.enable_autocast(dtype)
        autocast = pipe(generator=torch.Generator().manual_seed(seed), **call).sequences
        pipe.disable_autocast()
        result["token_agreement"] = (float32 == autocast).float().mean().item()
        result["seconds"] = round(time.perf_counter() - started, 1)
    return result


class _CpuAutocast(torch.autocast):
    """The official code's `autocast('cuda', ...)` on the CPU."""

    def __init__(self, device_type, *args, **kwargs):
        super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)


def against_official(elf_src: Path | None, langflow_src: Path | None) -> dict:
    sys.path.insert(0, str(REPO))
    from tests.conftest import Golden, elf_from_golden, langflow_from_golden

    torch.autocast = torch.amp.autocast = _CpuAutocast  # the official modules look them up at call time
    result = {}
    with torch.no_grad():
        if elf_src is not None:
            sys.path.insert(0, str(elf_src))
            from modules.model import ELF

            golden = Golden("elf_forward.safetensors")
            official = ELF(**golden.config).eval()
            official.load_state_dict(golden.weights, strict=False)  # its RoPE tables are not in the state dict
            ours = elf_from_golden(golden)
            ours.enable_autocast(torch.bfloat16)
            inputs = golden.inputs
            x = torch.cat([inputs["latent"], inputs["self_cond"]], dim=-1)
            for flag in (None, True):
                with _CpuAutocast("cuda", dtype=torch.bfloat16):  # as the official sampler wraps its model calls
                    sample, logits = official(
                        x, inputs["t"], self_cond_cfg_scale=inputs["sc_cfg_scale"], decoder_step_active=flag
                    )
                out = ours(inputs["latent"], inputs["t"], inputs["self_cond"], inputs["sc_cfg_scale"], flag)
                result[f"elf.prediction.decoder_{flag}"] = {
                    **_diff(out.sample, sample),
                    "bit_equal": torch.equal(out.sample, sample),
                    "official_bf16_vs_float32": _diff(sample, golden.outputs[f"x_pred.{str(flag).lower()}"]),
                }
                if logits is not None:
                    result["elf.logits"] = {**_diff(out.logits, logits), "bit_equal": torch.equal(out.logits, logits)}
        if langflow_src is not None:
            sys.path.insert(0, str(langflow_src))
            from langflow.config import LangFlowConfig
            from langflow.model import LangFlow

            golden = Golden("langflow_forward.safetensors")
            official = LangFlow(LangFlowConfig(**golden.config)).eval()
            official.load_state_dict(golden.weights)
            ours = langflow_from_golden(golden)
            ours.enable_autocast(torch.bfloat16)
            inputs = golden.inputs
            for name, self_cond in (("logits", inputs["self_cond"]), ("logits_no_self_cond", None)):
                logits = official(
                    noisy_embeds=inputs["latent"], timesteps=inputs["gamma"], x_self_cond=self_cond, return_dict=False
                )
                mine = ours(inputs["latent"], inputs["gamma"], self_cond).logits
                result[f"langflow.{name}"] = {
                    **_diff(mine, logits),
                    "bit_equal": torch.equal(mine, logits),
                    "official_bf16_vs_float32": _diff(logits, golden.outputs[name]),
                }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", help="a pipeline folder (e.g. hub_artifacts/langflow-small)")
    parser.add_argument("--nfe", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--official-elf-src", type=Path, default=None, help="the ELF port's src/ (modules/model.py)")
    parser.add_argument("--official-langflow-src", type=Path, default=None, help="LangFlow root (langflow/model.py)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    official = args.official_elf_src is not None or args.official_langflow_src is not None
    if official == (args.folder is not None):
        parser.error("give a pipeline folder, or --official-elf-src / --official-langflow-src (not both)")
    if official:
        report = against_official(args.official_elf_src, args.official_langflow_src)
    else:
        report = network_and_tokens(args.folder, args.nfe, args.batch_size, args.seed, getattr(torch, args.dtype))
    report["torch"] = torch.__version__
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
