PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) demos/correlated_field_2d.py --output demo_output/correlated_field_2d

test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV) demo_output .pytest_cache
