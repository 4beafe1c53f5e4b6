"""Suite-wide pytest setup: why ``import helpers`` works from every test directory.

pytest's default ("prepend") import mode puts the directory of a conftest that sits outside any package on
sys.path before importing it. This file sits in tests/, which has no __init__.py, so tests/ itself goes on
sys.path and the shared test support package tests/helpers/ is importable as ``helpers`` from tests/unit/
and tests/e2e/ alike, whichever test files a run selects.
"""
