# ZeRO Lab. Two commands do everything on a fresh machine:
#   make lab    set up, then open the course in JupyterLab
#   make test   set up, then run every test (unit, multi-rank, notebooks under nbval)
# Variables: TORCH (torch build to install, see scripts/setup_env.sh), VENV (default .venv).
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PYTHONHASHSEED := 0
NBVAL := --nbval --nbval-sanitize-with course/nbval_sanitize.cfg
# JupyterLab refuses to run as root without this flag (containers, CI machines run as root).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test test-fast notebooks check-notebooks release grade

setup:
	@VENV=$(VENV) scripts/setup_env.sh

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 $(ROOT_FLAG)

test: setup
	$(PY) -m pytest tests notebooks $(NBVAL) -ra $(PYTEST_ARGS)

test-fast: setup  ## everything except the notebooks and the slow multi-rank tests
	$(PY) -m pytest tests -m "not slow" -ra $(PYTEST_ARGS)

notebooks: setup  ## re-execute every chapter notebook in place (refresh expected outputs)
	$(PY) -m course.build

check-notebooks: setup
	$(PY) -m course.build --check

release: setup  ## the student release of every chapter, into release/
	$(PY) -m course.assign release notebooks/ch*.ipynb -o release

grade: setup  ## grade student notebooks: make grade STUDENTS="submissions/*/ch02_*.ipynb"
	$(PY) -m course.assign grade $(STUDENTS)
