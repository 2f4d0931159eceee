PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean docs test-fast lint test-current-jax

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)  ## API reference and guides into site/ (mkdocs --strict: any warning fails)
	$(PY) -m mkdocs build --strict

LINT_STAMP := $(VENV)/.installed-lint

$(LINT_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[lint]'
	touch $(LINT_STAMP)

lint: $(LINT_STAMP)  ## ruff (lint + format check) and pyright (basic), configured in pyproject.toml
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/pyright

demo: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) demos/correlated_field_2d.py --output demo_output/correlated_field_2d

test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n 2 tests

test-fast: $(STAMP)  ## the suite without the tests marked slow (pytest -m "not slow"), for development
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n 2 -m "not slow" tests

# the second supported JAX: the newest jax the registry serves for Python 3.12 (pyenv's 3.12.1), in its own venv
VENV_CUR := .venv-current-jax
PY_CUR   := $(VENV_CUR)/bin/python
STAMP_CUR := $(VENV_CUR)/.installed

$(STAMP_CUR): pyproject.toml
	PYENV_VERSION=3.12.1 python3.12 -m venv $(VENV_CUR)
	$(PY_CUR) -m pip install --quiet --upgrade pip
	$(PY_CUR) -m pip install --quiet -e '.[test]'
	touch $(STAMP_CUR)

test-current-jax: $(STAMP_CUR)  ## the suite on the newest jax for Python 3.12: all tests but the slow ones, every bitwise one
	$(PY_CUR) -c 'import jax, sys; print(f"jax {jax.__version__} on Python {sys.version.split()[0]}")'
	JAX_PLATFORMS=cpu $(PY_CUR) -m pytest -q -n 2 -m "not slow or product_compiler" tests

clean:
	rm -rf $(VENV) $(VENV_CUR) demo_output .pytest_cache site
