# Tessera: the two commands are `make serve` and `make test`. Both create .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv serve test data clean composer-venv

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt -c requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
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

serve: venv data
	$(VENV)/bin/tessera serve --host $(HOST) --port $(PORT)

test: venv data
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) .tessera

# Composer 0.32.1 as a peer for bench/ only (never a dependency). Its numpy<2.3 pin conflicts
# with ours, so it lives in its own virtualenv (ENVIRONMENT.md lists the working recipe).
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
