# Benchmarks and tests. `make bench` takes under 30 minutes on a 2-core machine, `make bench-quick` a few.
# Results: docs/benchmarks/<profile>.json (every sample, the machine), .md (the table), .png (the chart).
PYTHON ?= .venv/bin/python

.PHONY: bench bench-quick test stack

# The virtualenv first (a no-op when pyproject.toml has not changed), as scripts/test does.
bench:
	scripts/bootstrap.sh
	$(PYTHON) benchmarks/run.py full $(ARGS)

bench-quick:
	scripts/bootstrap.sh
	$(PYTHON) benchmarks/run.py quick $(ARGS)

test:
	scripts/test $(ARGS)

# The full stack natively (PostgreSQL, embedded Pravega, Airflow components): `make stack ARGS=--spark`;
# `scripts/stack status`, `scripts/stack down` (see docs/deployment.md, "The production topology without Docker").
stack:
	scripts/stack up $(ARGS)
