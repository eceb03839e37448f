"""Compiled Cython hot paths (built from cython_ext/ by setup.py)."""
