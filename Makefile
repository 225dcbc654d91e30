# ZeRO Lab. Two commands do everything on a fresh machine:
#   make lab    set up, then open the course in JupyterLab
#   make test   set up, then run every test (unit, multi-rank; the notebooks under nbval on another instruction set)
#   make test-portable   the numerical tests again and the grading of every chapter, on that instruction set (CI runs both)
# Variables: TORCH (torch build to install, see scripts/setup_env.sh), VENV (default .venv).
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PYTHONHASHSEED := 0
# DeepSpeed's CPU ops (built on first use, a minute each) live with the environment that built them: another
# checkout's environment builds its own instead of rebuilding this one's with its paths.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions
NBVAL := --nbval --nbval-sanitize-with course/nbval_sanitize.cfg
# JupyterLab refuses to run as root without this flag (containers, CI machines run as root).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
# Where `make lab` opens the course: work/, the student's own copy (exercises unsolved; made on first use,
# chapters added later, never overwritten); `make lab-zh` opens the Chinese one, work/zh/, made the same way.
# NOTEBOOK_DIR=notebooks opens the reference, solutions included. Extra JupyterLab options: e.g. LAB_ARGS="--port=8890".
NOTEBOOK_DIR ?= work
LAB_ARGS ?=

.PHONY: setup lab lab-zh workspace test test-ui test-peers test-browser test-portable test-fast notebooks check-notebooks release grade grade-class site

setup:
	@VENV=$(VENV) scripts/setup_env.sh

# The student's copies (work/ and work/zh/): chapters missing there are added, the student's own never touched.
workspace: setup
	$(PY) -m course.assign workspace notebooks/ch*.ipynb -o work
	@if ls notebooks/zh/ch*.ipynb >/dev/null 2>&1; then $(PY) -m course.assign workspace notebooks/zh/ch*.ipynb -o work/zh; fi

lab: setup
	@case "$(NOTEBOOK_DIR)" in work|work/|work/zh|work/zh/) $(MAKE) --no-print-directory workspace;; esac
	$(VENV)/bin/jupyter lab --notebook-dir=$(NOTEBOOK_DIR) --ServerApp.ip=127.0.0.1 $(ROOT_FLAG) $(LAB_ARGS)

# 中文版：在 work/zh/ 中打开你自己的一份（首次运行时生成）。The Chinese course, in the student's own work/zh/.
lab-zh:
	@$(MAKE) --no-print-directory lab NOTEBOOK_DIR=work/zh

# The tests on this CPU, then every notebook under strict nbval on another instruction set than the one that
# recorded its outputs (PORTABLE_ENV, below): a stored output that holds only on the recording CPU fails here.
test: setup
	$(PY) -m pytest tests -m "not other_isa and not browser and not peers" -ra --durations=15 $(PYTEST_ARGS)
	$(PORTABLE_ENV) $(PY) -m pytest notebooks $(NBVAL) -ra $(PYTEST_ARGS)

# The comparisons that run DeepSpeed 0.19.8 itself beside zero_ref on CPU ranks (client scripts under torchrun,
# the pipeline engine, the MoE layer, the batch arithmetic over a grid): minutes, so apart from make test; CI runs them.
test-peers: setup
	$(PY) -m pytest tests -m peers -ra $(PYTEST_ARGS)

# Every chapter with an explorer in JupyterLab and headless Chromium (make test drives ch01, ch08 and ch20):
# Run All, then each explorer's controls moved one at a time, every figure shown compared with the kernel's
# own drawing of the same values. Screenshots: ZERO_LAB_SCREENSHOTS=folder; chapters at once: ZERO_LAB_BROWSER_JOBS.
test-ui: setup  ## the course as a reader sees it: the static site, chapters 1, 8, 20 and a Chinese one in Chromium (CI runs it)
	$(PY) -m pytest tests/notebooks/test_browser.py tests/course/test_site.py -m "browser and not browser_full" -ra $(PYTEST_ARGS)

test-browser: setup
	$(PY) -m pytest tests/notebooks/test_browser.py -ra $(PYTEST_ARGS)

# ATen's portable kernels instead of AVX2 / AVX-512, and MKL's reproducible code path for matrix products:
# results differ from the native run in the last bits (tests/zero_ref/test_portability.py shows that they do).
# make test runs the notebooks so; test-portable runs the numerical tests again so, and grades each chapter's
# releases there against the natively recorded outputs: the student release fails every check, the alternative
# answers (tests/notebooks/alternatives/) pass and the mistakes fail (one kernel per chapter, two at a time).
PORTABLE_ENV := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ZERO_LAB_PORTABLE=1
# the tests whose numbers a kernel's summation order reaches: every stage against one process, the kernels,
# precision, offload, the flat optimizer, tensor-parallel matmuls, MoE routing, compression
NUMERICAL_TESTS := $(patsubst %,tests/zero_ref/test_%.py,portability zero_stages zero3 precision kernels offload \
  flat_optim tensor_parallel moe compression)
test-portable: setup
	$(PORTABLE_ENV) $(PY) -m pytest $(NUMERICAL_TESTS) \
	  tests/notebooks/test_notebooks.py::test_student_release_fails_every_check \
	  tests/notebooks/test_notebooks.py::test_alternative_answers_pass_and_mistakes_fail -ra $(PYTEST_ARGS)

test-fast: setup  ## everything except the notebooks and the slow multi-rank tests
	$(PY) -m pytest tests -m "not slow" -ra $(PYTEST_ARGS)

notebooks: setup  ## re-execute every chapter notebook in place (refresh expected outputs), then the Chinese edition
	$(PY) -m course.build
	$(PY) -m course.build --lang zh

check-notebooks: setup
	$(PY) -m course.build --check

release: setup  ## the student release of every chapter, into release/ (and release/zh/ for the Chinese edition)
	$(PY) -m course.assign release notebooks/ch*.ipynb -o release
	@if ls notebooks/zh/ch*.ipynb >/dev/null 2>&1; then $(PY) -m course.assign release notebooks/zh/ch*.ipynb -o release/zh; fi

site: setup  ## the course as a static web site, into site/ (open site/index.html)
	$(PY) -m course.site -o site

grade: setup  ## grade student notebooks: make grade STUDENTS="submissions/*/ch02_*.ipynb"
	$(PY) -m course.assign grade $(STUDENTS)

SUBMISSIONS ?= submissions
grade-class: setup  ## grade a class: SUBMISSIONS/<student>/chNN_*.ipynb → table + grades.csv
	$(PY) -m course.assign class $(SUBMISSIONS) --csv grades.csv --json grades.json --jobs 2

# The fused Adam CUDA extension (zero_ref/kernels/csrc), compiled with nvcc against PyTorch 2.14.1's
# CUDA 13 build in a separate venv (.venv-cuda, ~5.5 GB; the course venv keeps its CPU torch).
# Compiling needs the CUDA toolkit, not a GPU. CUDA_HOME: the toolkit root whose lib64/ holds
# libcudart.so. TORCH_CUDA_ARCH_LIST: 9.0 = Hopper (H100/H200).
CUDA_VENV ?= .venv-cuda
CUDA_HOME ?= /usr/local/cuda
TORCH_CUDA_ARCH_LIST ?= 9.0
.PHONY: cuda-ext
cuda-ext:  ## compile the fused Adam CUDA extension (then tests/zero_ref/test_kernels.py checks the build)
	@[ -x $(CUDA_VENV)/bin/python ] || { $(or $(PYTHON),$(shell command -v python3.11 || command -v python3)) -m venv $(CUDA_VENV) \
	  && $(CUDA_VENV)/bin/python -m pip --disable-pip-version-check -q install torch==2.14.1 ninja; }
	PATH=$(abspath $(CUDA_VENV))/bin:$$PATH CUDA_HOME=$(CUDA_HOME) TORCH_CUDA_ARCH_LIST="$(TORCH_CUDA_ARCH_LIST)" \
	  PYTHONPATH=. $(CUDA_VENV)/bin/python -m zero_ref.kernels.cuda_ext --build

# The prepared GPU check (scripts/gpu_check.py): on a GPU machine with its own python3 (no venv, nothing
# installed), under 8 minutes, writing OUT/results.json and OUT/results.md. DRY=1 runs its structure on the
# CPU instead; QUICK=1 fewer sizes; PARTS=ext,stages picks parts; FAIL=part makes that part raise (the
# others must still run). OUT=benchmarks/gpu is the stored measurement chapter 14 shows.
GPU_PYTHON ?= python3
.PHONY: gpu-check
gpu-check:  ## the GPU check: make gpu-check OUT=dir [DRY=1] [QUICK=1] [PARTS=ext,stages,...] [FAIL=part]
	@[ -n "$(OUT)" ] || { echo "usage: make gpu-check OUT=dir [DRY=1] [QUICK=1] [PARTS=a,b] [FAIL=part]"; exit 2; }
	PYTHONPATH=. $(GPU_PYTHON) scripts/gpu_check.py --out $(OUT) $(if $(DRY),--dry-run) $(if $(QUICK),--quick) \
	  $(if $(PARTS),--parts $(PARTS)) $(if $(FAIL),--fail-part $(FAIL))
