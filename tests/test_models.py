"""Finding the model: a given path, the installed package, the cache, or a clear error."""
import pytest

from llmd import models


def test_missing_model_path_names_the_fix(tmp_path):
    with pytest.raises(models.ModelError, match="does not exist; pass --model"):
        models.resolve_model(str(tmp_path / "nope.gguf"))


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(models.ModelError, match="not a readable file"):
        models.resolve_model(str(tmp_path))


def test_given_path_is_used_as_is(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert models.resolve_model(str(path)) == path


def test_cache_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert models.cache_dir() == tmp_path / "llmd"


def test_default_model_is_found_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(models, "installed_default", lambda: None)
    (tmp_path / "llmd").mkdir()
    (tmp_path / "llmd" / models.DEFAULT_FILE).write_bytes(b"GGUF")
    assert models.default_model(fetch=False) == tmp_path / "llmd" / models.DEFAULT_FILE


def test_absent_default_model_without_fetch_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(models, "installed_default", lambda: None)
    with pytest.raises(models.ModelError, match="python -m llmd pull"):
        models.default_model(fetch=False)
