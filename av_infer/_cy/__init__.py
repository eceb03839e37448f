"""Compiled Cython hot paths (the .pyx/.pxd sources beside this file, built by setup.py)."""
