"""setuptools runs the cffi_modules keyword only from setup() arguments, never from
setup.cfg; all other metadata lives in setup.cfg."""
from setuptools import setup

setup(cffi_modules=["build_native.py:ffibuilder"])
