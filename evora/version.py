"""evora's version, written here only: pyproject.toml reads it (setuptools' dynamic version),
`evora.__version__` and the model cards quote it, and `make release-check` checks that the
built sdist and wheel and CHANGELOG.md's first released entry carry it."""

__version__ = "0.1.0"
