# ftta: two commands for a new user (each creates .venv and installs what it needs on first use)
#   make quickstart   run the main job: a small federated TTA experiment on the embedded digits
#   make test         run the whole test suite (unit tests + notebooks in smoke mode, validated with nbval)
# and `make lab`: JupyterLab on the project's kernel, with the quickstart open (README "Open the notebooks")
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ftta-installed
# the extras of pyproject.toml installed into .venv (environment.yml installs the same; tests/test_lab.py checks)
EXTRAS := notebooks,test,lab,docs
# installed with --no-deps after the extras ([tool.ftta] no-deps in pyproject.toml says why): imagecorruptions ships
# the frost textures and is never imported; its requirements (opencv-python, scikit-image) are ~90 MB nothing here
# imports, and opencv-python 4.12 caps numpy<2.3, which would downgrade the venv's numpy
NO_DEPS := imagecorruptions==1.1.2
# `make lab`: JupyterLab serving the repository (examples/, figures/, configs/ and the README in reach) with the
# quickstart open, on the `python3` kernel the install step puts in .venv (the kernel name the notebooks use);
# notebooks run with notebooks/ as their folder (the server starts each kernel in its notebook's folder), as under
# papermill. JUPYTER_PREFER_ENV_PATH=1: a user-level kernel named python3 cannot shadow it.
# .jupyter/jupyter_server_config.py: jupytext pairs each notebook with its source notebooks/NN_name.py (hidden in the
# file browser) and opening then saving a notebook rewrites no byte (tests/test_lab_roundtrip.py); jupytext.toml.
# More flags:
#   make lab LAB_ARGS="--no-browser --port 8899"
LAB_FLAGS := --config=.jupyter/jupyter_server_config.py --ServerApp.root_dir=. \
	--MappingKernelManager.default_kernel_name=python3 --LabApp.default_url=/lab/tree/notebooks/00_quickstart.ipynb
LAB_ARGS ?=
# Jupyter refuses to run as root unless told (containers often run as root)
LAB_ROOT = $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

.PHONY: install quickstart test test-fast lab notebooks figures paper-runs clean docs docs-screenshots

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	$(PY) -m pip install --quiet --no-deps $(NO_DEPS)
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

# JupyterLab from .venv (installed with the `lab` extra by the install step above), serving the repository
lab: $(STAMP)
	JUPYTER_PREFER_ENV_PATH=1 $(PY) -m jupyterlab $(LAB_FLAGS) $(LAB_ROOT) $(LAB_ARGS)

# executed notebook and its figure under runs/quickstart/ (runs/quickstart/figures/quickstart_collaboration.png);
# a progress line per stage on stderr (install; then, from the runner: the notebook, each run, data decoded on first
# use, the figure)
quickstart: $(STAMP)
	@echo "install: done ($(VENV) is up to date with pyproject.toml)" >&2
	$(PY) -m ftta_core notebooks 00_quickstart --out-dir runs/quickstart --show

# TEST_WORKERS pytest-xdist processes (one per core; tests/conftest.py gives each its share of torch threads).
# make test: --dist loadfile keeps a test file, and a notebook's cells (which share one kernel), in one process;
# make test-fast has no notebooks: --dist worksteal balances single tests. TEST_WORKERS=0: one process, in order.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
XDIST_FAST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
test: $(STAMP)
	FTTA_SMOKE=1 MPLBACKEND=Agg $(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider $(XDIST)

# the unit tests without the notebooks and without the tests that start servers or processes (tests/conftest.py
# SLOW_FILES, and single tests marked slow): the float64 oracles, the unit lock and the run store included
test-fast: $(STAMP)
	FTTA_SMOKE=1 MPLBACKEND=Agg $(PY) -m pytest tests -m "not slow" -q -p no:cacheprovider $(XDIST_FAST)

# every notebook in smoke mode; executed copies (and any figures) under runs/notebooks/smoke/, nothing tracked written
notebooks: $(STAMP)
	$(PY) -m ftta_core notebooks --smoke --out-dir runs/notebooks/smoke

# full runs that regenerate the committed notebooks/*.ipynb and figures/ (each notebook replaced only if it succeeded)
figures: $(STAMP)
	$(PY) -m ftta_core notebooks --in-place

# The stored CIFAR-10-C paper runs (resumable). The tables plan their missing runs (FTTA_PLAN), run-plan runs them
# WORKERS at a time, then the tables are written from the stored runs. On one GPU, start the MPS daemon first
# (nvidia-cuda-mps-control -d): 14 workers then run ~4x more runs per minute than without it (benchmarks/README.md).
BASELINES := local fedavg fedavg_ft fedprox fedavgm fedamp moon pfedsd pfedgraph ldawa
SEEDS ?= 0 1 2
WORKERS ?= 1
PLAN ?= runs/paper-runs.plan.jsonl
TABLE1 = $(PY) -m ftta_core study fedtsa table --strategies $(BASELINES) fedtsa fedctta --seeds $(SEEDS) \
	--results figures/fedtsa_table1/runs
paper-runs: $(STAMP)
	rm -f $(PLAN)
	FTTA_PLAN=$(PLAN) $(TABLE1) --tta bn --table figures/fedtsa_table1/cifar10_bn
	FTTA_PLAN=$(PLAN) $(TABLE1) --tta grad --table figures/fedtsa_table1/cifar10_grad
	if [ -s $(PLAN) ]; then $(PY) -m ftta_core run-plan $(PLAN) --workers $(WORKERS); fi
	$(TABLE1) --tta bn --table figures/fedtsa_table1/cifar10_bn --only-cached
	$(TABLE1) --tta grad --table figures/fedtsa_table1/cifar10_grad --only-cached
	$(PY) -m ftta_core study fedtsa case-study --tta bn --out figures/case_study/cifar10_bn
	$(PY) -m ftta_core notebooks 10_fedtsa 11_fedtsa_ablations 12_fedtsa_collaboration --in-place

# the workbook as a static site in site/ (mkdocs.yml; the `docs` extra, installed by the install step because
# tests/test_docs_site.py builds it in `make test`): the README, docs/*.md and the committed notebooks as executed (not
# run again); --strict fails on a broken link between pages, then docs/site_links.py checks every internal link and
# image of the built HTML and lists the external links (not fetched)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site
	$(PY) docs/site_links.py site

# the built site's landing page and notebook 10 in headless Chromium (apt-get install chromium; CI does not need it):
# docs/screenshots/site_landing.png, docs/screenshots/site_notebook_10.png
docs-screenshots: docs
	$(PY) docs/site_screenshots.py --site site --out docs/screenshots

clean:
	rm -rf runs build site .pytest_cache
