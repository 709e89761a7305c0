#!/usr/bin/env bash
# Session 12, call 6: sparse tests (default paths and forced portable) after the host-side row-thread helper.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
py=python3
timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py 2>&1 | tail -3
MLA_EXT_FORCE_PORTABLE=1 timeout 100 $py -m pytest -q -m gpu --tb=short -p no:cacheprovider tests/test_sparse_gpu.py -k "not selects_kernel or portable or row_threads" 2>&1 | tail -3
