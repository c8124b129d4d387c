# Every verb sets up what it needs: a fresh machine only needs python3 (3.11+) and, for
# the Spark parts, Java 17.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DATA   ?= ./data
PORT   ?= 8080

# Spark's Python processes run this venv's Python through the launcher that imports
# pyspark from site-packages, not Spark's zip (src/cherami/sparkpython.py)
export PYSPARK_PYTHON := $(abspath $(VENV)/bin/cherami-spark-python)
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: install sysdeps run demo test test-fast test-spark lint bench bench-quick bench-throughput bench-floor bench-ratio bench-spark bench-scaleout clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,dev,spark]'
	touch $(STAMP)

install: $(STAMP)

## run: start a node on the embedded default (RocksDB store hosts + SQLite) on $(PORT)
run: $(STAMP)
	$(VENV)/bin/cherami serve --data-dir $(DATA) --port $(PORT)

## demo: the crash-report pipeline end to end (node, workers, DLQ, Spark), then a report
demo: $(STAMP)
	$(PY) demo/crash_reports.py

## sysdeps: the system tools the network-namespace tests use, curl and jq for the docs'
## examples, the headless browser of the web console's tests and promtool for the alert
## rules (Debian; needs root; each skipped when present)
sysdeps:
	@command -v ip >/dev/null && command -v iptables >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq iproute2 iptables >/dev/null)
	@command -v curl >/dev/null && command -v jq >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq curl jq >/dev/null)
	@test -x /usr/bin/chromium && test -x /usr/bin/chromedriver || \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)
	@command -v promtool >/dev/null || (apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null)

## test: the whole suite (unit, contract, integration, Spark, faults), on three workers
## (tests/conftest.py keeps the fault proofs together on one of them, and the other
## timing-sensitive tests together on another), then the tests marked `alone`, with the
## machine to themselves
test: $(STAMP) sysdeps
	$(PY) -m pytest -p no:cacheprovider -n 3 -m "not alone"
	$(PY) -m pytest -p no:cacheprovider -m alone

test-spark: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/spark

bench-spark: $(STAMP)
	$(PY) benchmarks/spark_read.py

test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/unit tests/contract


## lint: ruff, mypy, and the package layers (tests/unit/test_layers.py: roles meet only
## through their clients, imports go downwards, no package cycle)
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy
	$(PY) -m pytest -p no:cacheprovider -q tests/unit/test_layers.py

bench: $(STAMP)
	$(PY) benchmarks/bench.py

bench-quick: $(STAMP)
	$(PY) benchmarks/bench.py --quick

bench-throughput: $(STAMP)
	$(PY) benchmarks/throughput.py

bench-floor: $(STAMP)
	$(PY) benchmarks/storage_floor.py

## bench-ratio: streaming publish at 3 replicas, then the 3-writer floor at once, and the ratio
bench-ratio: $(STAMP)
	$(PY) benchmarks/throughput.py --replicas 3 --floor

## bench-scaleout: publish and consume+ack with 1, 2, 4 capped hosts in network namespaces, then a saturating scaling run
## (root); ARGS=--quick for a short run
bench-scaleout: $(STAMP) sysdeps
	$(PY) benchmarks/scaleout.py $(ARGS)

clean:
	rm -rf $(VENV) $(DATA) build *.egg-info
