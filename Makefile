# The two commands: `make demo` and `make test`. Both create .venv when it is
# missing and (re)install the project when setup.py changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU machines get tensorflow-cpu, machines with an NVIDIA driver tensorflow[and-cuda].
TF_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP  := $(VENV)/.installed-$(TF_EXTRA)

.PHONY: demo test lint clean

$(STAMP): setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(TF_EXTRA),dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/python examples/simple/simple_train.py --resource_info resource_info.example

test: $(STAMP)
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
