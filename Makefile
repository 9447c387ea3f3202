# vlmq — the only commands a fresh machine needs: `make up`, `make test`, `make bench`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv up test test-chaos test-browser test-compose lint bench bench-smoke bench-engine bench-service bench-decode bench-redis-parser bench-request-cost bench-turns bench-scale bench-priority bench-soak bench-gpu train train-smoke eval clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .  # the project itself: the `vlmq` command
	touch $(STAMP)

up: venv
	$(BIN)/python -m scripts.up

test: venv
	$(BIN)/python -m scripts.run_tests $(ARGS)

# make up under SIGKILLs of every worker kind and a Redis restart (<= 8 min); CI runs it
test-chaos: venv
	$(BIN)/python -m scripts.run_tests tests/chaos -m chaos -s

# the web page in headless Chromium against the real stack (<= 5 min; needs Debian's chromium and
# chromium-driver, which .ci/run installs); screenshots and axe reports under .artifacts/browser/
test-browser: venv
	$(BIN)/python -m scripts.run_tests tests/browser -m browser $(ARGS)

# docker-compose.yml for real (needs Docker + Compose v2: ../shared/docker/setup.sh); not in `make test`
test-compose: venv
	$(BIN)/python -m scripts.run_tests tests_compose -v $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared gateway worker services tinyvlm bench scripts tests tests_compose docker vlmq_cli
	$(BIN)/lint-imports

bench: bench-engine bench-service bench-decode bench-redis-parser bench-request-cost bench-turns bench-scale bench-priority

bench-engine: venv
	$(BIN)/python -m bench.engine_bench

# three interleaved runs a level: one run's ratio spreads +-15 % on a shared 2-core host (~9 min,
# 5 of them the sustained memory run)
bench-service: venv
	$(BIN)/python -m bench.service_bench --repeats 3

# JPEG draft mode: the decode hop's CPU per image and the answers at each oversample (~2 min)
bench-decode: venv
	$(BIN)/python -m bench.decode_bench

bench-redis-parser: venv
	$(BIN)/python -m bench.redis_parser_bench

# CPU and Redis commands of one request, by kind of request (~2 min)
bench-request-cost: venv
	$(BIN)/python -m bench.request_cost

# each turn of a conversation (a picture, then text follow-ups): stage times and CPU a turn (~1 min)
bench-turns: venv
	$(BIN)/python -m bench.turns_bench

# every benchmark in seconds, tiny counts (figures mean nothing; make test runs all but the scale bench)
bench-smoke: venv
	$(BIN)/python -m bench.engine_bench --smoke
	$(BIN)/python -m bench.service_bench --smoke
	$(BIN)/python -m bench.decode_bench --smoke
	$(BIN)/python -m bench.redis_parser_bench --smoke
	$(BIN)/python -m bench.request_cost --smoke
	$(BIN)/python -m bench.turns_bench --smoke
	$(BIN)/python -m bench.gpu_bench --smoke
	$(BIN)/python -m bench.gpu_exactness --smoke
	$(BIN)/python -m bench.scale_bench --smoke
	$(BIN)/python -m bench.priority_bench --smoke

# exactness on CUDA (fp32, bf16), then vlmq vs transformers serve on a CUDA device, random ~0.85B GLM-4V (needs a CUDA build of torch)
bench-gpu: venv
	$(BIN)/python -m bench.gpu_exactness --device cuda
	VLMQ_DEVICE=cuda $(BIN)/python -m bench.gpu_bench

# 1 vs 2 inference workers, cache-aware routing on/off (~6 min); exits 1 if routing loses session hits
bench-scale: venv
	$(BIN)/python -m bench.scale_bench

# an interactive tenant's p50 under a batch tenant's flood, vs unloaded (~3 min)
bench-priority: venv
	$(BIN)/python -m bench.priority_bench

# nightly: 10 min at 70 % of capacity, RSS/keys/p99 flat (~17 min with the TTL waits)
bench-soak: venv
	$(BIN)/python -m bench.soak_bench

train: venv
	$(BIN)/python -m tinyvlm.train

train-smoke: venv
	$(BIN)/python -m tinyvlm.train --smoke

eval: venv
	$(BIN)/python -m tinyvlm.evaluate

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache runs .run
