# Quick start: `make demo` (the main job) and `make test` (ruff + mypy + import contracts + pytest).
# Each target installs what it needs into .venv first, so either works on a fresh clone.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed-test
BENCH_INSTALLED := $(VENV)/.installed-bench
DEMO_OUT ?= demo-out

.PHONY: install demo test test-fast test-slow test-portable test-postgres test-replicas test-zoo lint typecheck pytest android-test monitoring-check arm-check bench results resnet34-digits poisoning bn-sharing dp-results clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,test]'
	touch $@

$(BENCH_INSTALLED): $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e '.[all,test,bench]'
	touch $@

demo: $(INSTALLED)
	$(BIN)/fedper demo --out $(DEMO_OUT)

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(INSTALLED)
	$(BIN)/mypy
	$(BIN)/lint-imports

# `make test`'s tests: all but those marked `slow` (README, "Development"). The storage tests run
# on SQLite and on a scratch PostgreSQL cluster (Debian's server, installed first if missing); the
# replicas' test puts Debian's nginx in front of three servers.
pytest: $(INSTALLED)
	server/monitoring/ensure-debian-package.sh pg_ctlcluster postgresql
	server/monitoring/ensure-debian-package.sh nginx nginx-light
	$(BIN)/python -m pytest -q -m "not slow"

# Three replicas behind nginx, one killed with -9 in each of 20 rounds (docs/SCALING.md).
test-replicas: $(INSTALLED)
	server/monitoring/ensure-debian-package.sh pg_ctlcluster postgresql
	server/monitoring/ensure-debian-package.sh nginx nginx-light
	FEDPER_REPLICA_TRIALS=20 $(BIN)/python -m pytest -q -s tests/integration/test_replicas.py tests/unit/server/test_replicas.py

# The server's whole suite (not slow) with every test server's records on PostgreSQL.
test-postgres: $(INSTALLED)
	server/monitoring/ensure-debian-package.sh pg_ctlcluster postgresql
	FEDPER_TEST_DATABASE=postgres $(BIN)/python -m pytest -q -m "not slow" tests/unit/server

# The tests `make test` leaves out: real server and device processes (kill -9, timeouts, bursts),
# Ray, a fresh venv, full simulations, the plain graph's export, the dashboard in Debian's chromium
# (installed first if missing). CI runs them after `make test`.
test-slow: $(INSTALLED)
	server/monitoring/ensure-debian-package.sh chromium chromium
	$(BIN)/python -m pytest -q -m slow

# Every named model (torchvision's) exported at 32 and 224 px and checked against eager PyTorch,
# float64 and the simulation through a fleet round, claims in test-zoo/claims.md: about an hour
# here (docs/EXPORT.md).
ZOO_SIZES ?= 32,224
test-zoo: $(INSTALLED)
	mkdir -p test-zoo
	FEDPER_ZOO=$(ZOO_SIZES) $(BIN)/python -m pytest -q -m zoo tests/integration/test_model_zoo.py \
		--junitxml=test-zoo/zoo.xml; status=$$?; \
		$(BIN)/python -m tests.support.portable --claims test-zoo/zoo.xml > test-zoo/claims.md; exit $$status

# The edit loop: lint and the tests that need no export and no process and are not decided by
# float results (training: `make test-portable` runs those on every kernel set).
test-fast: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow and not export and not numeric"

# The Android app's plain-Java core, built and tested on the host JVM (a JDK and JUnit 4 from
# Debian, installed first if missing), then the app's trainer on ExecuTorch's real training
# runtime built for the host JVM (android_demo/README.md, "The real runtime on the host").
android-test: $(INSTALLED)
	android_demo/core/ensure-jdk.sh
	android_demo/core/host-test.sh $(abspath $(BIN))/python

# The operator's alert rules: valid, and each fires on the series it is for (promtool, from
# Debian's prometheus package, installed first if missing).
monitoring-check:
	server/monitoring/ensure-debian-package.sh promtool prometheus
	promtool check rules server/monitoring/alerts.yml
	cd server/monitoring && promtool test rules alerts_test.yml

# The device on the phone's instruction set: an aarch64 Debian root under qemu-user (cached in
# FEDPER_ARM_CACHE) runs the first training step against x86-64's and two rounds of `fedper
# device` against `fedper serve` (docs/DEVICES.md, "An ARM device on this machine"). Not in `make test`.
arm-check: $(INSTALLED)
	device_runtime/arm/arm_check.sh $(abspath $(BIN))/python

# Two at a time: pytest's first minutes leave a core to spare (its exports are single-threaded),
# which the checks use; each target's output is printed in one piece when it ends.
test: $(INSTALLED)
	$(MAKE) --no-print-directory -j2 --output-sync=target pytest lint typecheck android-test monitoring-check

# The numeric tests (marker `numeric`) under every kernel set this CPU supports, at 1 and 2
# threads; then each test's claims beside their bounds (test-portable/claims.md). README, "Development".
PORTABLE ?=
test-portable: $(INSTALLED)
	$(BIN)/python -m tests.support.portable --out test-portable $(PORTABLE)

# Every table of docs/RESULTS.md, on 3 seeds, written into it (runs reused from runs/results).
results: $(INSTALLED)
	$(BIN)/python docs/scripts/data_figure.py docs/img/synth_users.png
	$(BIN)/python -m fedper._recipes.results_suite --out runs/results --write docs/RESULTS.md

# The FedPer paper's second architecture (torchvision's ResNet-34, head fc) on digits: docs/RESULTS.md.
resnet34-digits: $(INSTALLED)
	$(BIN)/python -m fedper._recipes.resnet34_digits --out runs/resnet34 --write docs/RESULTS.md

# The poisoning table of docs/SERVER.md: one hostile device against each aggregation option.
poisoning: $(INSTALLED)
	$(BIN)/python -m fedper._recipes.poisoning --out runs/poisoning --write docs/SERVER.md

# The BatchNorm table of docs/RESULTS.md: FedPer with the base's statistics shared (validated by the
# robust aggregation) or kept on each device (FedBN), paired per client; 12 runs, one at a time.
bn-sharing: $(INSTALLED)
	$(BIN)/python -m fedper._recipes.bn_sharing --out runs/bn_sharing --write docs/RESULTS.md

# The DP table of docs/RESULTS.md: accuracy against epsilon for FedPer and FedAvg, 1,000 users;
# 12 runs, two at a time (about 80 minutes here).
dp-results: $(INSTALLED)
	$(BIN)/python -m fedper._recipes.dp_suite --out runs/dp --write docs/RESULTS.md

bench: $(BENCH_INSTALLED)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache $(DEMO_OUT) android_demo/core/build test-portable test-zoo
