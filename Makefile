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

quickstart: $(STAMP)
	$(PY) -m ftta_core notebooks 00_quickstart --out-dir runs/quickstart --show

test: $(STAMP)
	FTTA_SMOKE=1 MPLBACKEND=Agg $(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider

notebooks: $(STAMP)
	$(PY) -m ftta_core notebooks --smoke --out-dir runs/notebooks

figures: $(STAMP)
	$(PY) -m ftta_core notebooks

# The stored CIFAR-10-C paper runs (resumable; hours on a 2-core CPU, minutes on a GPU: DEVICE=cuda SEEDS="0 1 2 3 4")
BASELINES := local fedavg fedavg_ft fedprox fedavgm fedamp moon pfedsd pfedgraph ldawa
SEEDS ?= 0 1 2
DEVICE ?= auto
paper-runs: $(STAMP)
	$(PY) -m ftta_core fedtsa-table --tta bn --strategies $(BASELINES) fedtsa fedctta --seeds $(SEEDS) --device $(DEVICE) \
		--results figures/fedtsa_table1/runs --table figures/fedtsa_table1/cifar10_bn
	$(PY) -m ftta_core fedtsa-table --tta grad --strategies $(BASELINES) fedtsa fedctta --seeds $(SEEDS) --device $(DEVICE) \
		--results figures/fedtsa_table1/runs --table figures/fedtsa_table1/cifar10_grad
	$(PY) -m ftta_core case-study --tta bn --device $(DEVICE) --out figures/case_study/cifar10_bn
	$(PY) -m ftta_core notebooks 10_fedtsa 11_fedtsa_ablations 12_fedtsa_collaboration

clean:
	rm -rf runs build .pytest_cache
