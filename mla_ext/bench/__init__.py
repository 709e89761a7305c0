"""Benchmarks of the mla_ext ops: a shared harness plus one module per op. The command-line
entry points are the scripts in the repository's ``bench/`` folder and ``python -m mla_ext``."""
