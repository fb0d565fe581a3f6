"""setuptools runs the cffi_modules keyword only from setup() arguments, never from
setup.cfg; all other metadata lives in setup.cfg. build_ext compiles each kernel
variant's translation units with the variant's own flags (build_native.VARIANT_FLAGS)."""
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # build_native.py, under pip's isolated build too
import build_native  # noqa: E402


class BuildExt(build_ext):
    def build_extension(self, ext):
        variants = [s for s in ext.sources if build_native.variant_flags(s) is not None]
        # A variant's instructions are its own flags alone, whatever LLMD_MARCH gives the rest.
        common = [a for a in ext.extra_compile_args if not a.startswith("-march=")]
        objects = []
        for source in variants:
            objects += self.compiler.compile(
                [source], output_dir=self.build_temp, include_dirs=ext.include_dirs, depends=ext.depends,
                extra_postargs=common + build_native.variant_flags(source))
        ext.sources = [s for s in ext.sources if s not in variants]
        ext.depends = list(ext.depends) + variants  # still sources of the module's, for the relink check
        ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extension(ext)


setup(cffi_modules=["build_native.py:ffibuilder"], cmdclass={"build_ext": BuildExt})
