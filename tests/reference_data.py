"""Reference data the tokenizer and chat-template tests compare against, fetched once.

llama.cpp's source tree ships tokenizer vocabularies with expected token ids
(`models/ggml-vocab-*.gguf` + `.inp` / `.out`) and real models' chat templates
(`models/templates/*.jinja`). They come from the `llama-cpp-python` source
distribution on PyPI, which vendors that tree: `python -m tests.reference_data`
downloads it once with pip and extracts just those files into llmd's cache
directory. The README's test command runs it; the tests themselves stay offline and
fail with this instruction when the files are missing.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

from llmd.engine.fetch import cache_dir

PACKAGE = "llama-cpp-python==0.3.36"
# Members of the sdist we keep, by their path under the vendored llama.cpp tree.
_TREE = "vendor/llama.cpp/"
_KEEP = ("models/ggml-vocab-", "models/templates/")


def reference_dir() -> pathlib.Path:
    """Where the extracted files live: <cache>/reference/<package>/models/..."""
    return cache_dir() / "reference" / PACKAGE.replace("==", "-")


def require(relative: str) -> pathlib.Path:
    """A path under reference_dir(); a clear failure if the data was never fetched."""
    path = reference_dir() / relative
    if not path.exists():
        import pytest
        pytest.fail(f"reference data {path} is missing: run `python -m tests.reference_data` once "
                    f"(it downloads {PACKAGE} from PyPI)", pytrace=False)
    return path


def _wanted(name: str) -> str | None:
    """The path to keep a tar member under, or None to skip it."""
    _, _, rest = name.partition("/")  # drop the sdist's top folder
    if not rest.startswith(_TREE):
        return None
    inner = rest[len(_TREE):]
    return inner if inner.startswith(_KEEP) and ".." not in inner.split("/") else None


def fetch() -> pathlib.Path:
    """Download the sdist with pip (no dependencies, no build) and extract the data."""
    target = reference_dir()
    done = target / ".complete"
    if done.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        print(f"fetching {PACKAGE} (source, about 77 MB) with pip for the reference data", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--disable-pip-version-check", "--quiet", "-d", tmp, PACKAGE], check=True)
        archives = list(pathlib.Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise SystemExit(f"pip downloaded no source archive for {PACKAGE}")
        staging = pathlib.Path(tmp) / "data"
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                inner = _wanted(member.name)
                if inner is None or not member.isfile():
                    continue
                out = staging / inner
                out.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(out, "wb") as dst:
                    dst.write(src.read())
        (staging / ".complete").write_text(PACKAGE + "\n")
        if target.exists():
            import shutil
            shutil.rmtree(target)
        os.replace(staging, target)  # atomic: a half extraction is never taken as complete
    return target


if __name__ == "__main__":
    print(fetch())
