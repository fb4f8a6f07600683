# ftta: two commands for a new user (each creates .venv and installs what it needs on first use)
#   make quickstart   run the main job: a small federated TTA experiment on the embedded digits
#   make test         run the whole test suite (unit tests + notebooks in smoke mode, validated with nbval)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ftta-installed

.PHONY: install quickstart test notebooks figures paper-runs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[notebooks,test]"
	$(PY) -m pip install --quiet --no-deps imagecorruptions==1.1.2
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

# executed notebook and its figure under runs/quickstart/ (runs/quickstart/figures/quickstart_collaboration.png)
quickstart: $(STAMP)
	$(PY) -m ftta_core notebooks 00_quickstart --out-dir runs/quickstart --show

test: $(STAMP)
	FTTA_SMOKE=1 MPLBACKEND=Agg $(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider

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
TABLE1 = $(PY) -m ftta_core fedtsa-table --strategies $(BASELINES) fedtsa fedctta --seeds $(SEEDS) \
	--results figures/fedtsa_table1/runs
paper-runs: $(STAMP)
	rm -f $(PLAN)
	FTTA_PLAN=$(PLAN) $(TABLE1) --tta bn --table figures/fedtsa_table1/cifar10_bn
	FTTA_PLAN=$(PLAN) $(TABLE1) --tta grad --table figures/fedtsa_table1/cifar10_grad
	if [ -s $(PLAN) ]; then $(PY) -m ftta_core run-plan $(PLAN) --workers $(WORKERS); fi
	$(TABLE1) --tta bn --table figures/fedtsa_table1/cifar10_bn --only-cached
	$(TABLE1) --tta grad --table figures/fedtsa_table1/cifar10_grad --only-cached
	$(PY) -m ftta_core case-study --tta bn --out figures/case_study/cifar10_bn
	$(PY) -m ftta_core notebooks 10_fedtsa 11_fedtsa_ablations 12_fedtsa_collaboration --in-place

clean:
	rm -rf runs build .pytest_cache
