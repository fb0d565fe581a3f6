"""Finding the model: a given path, the installed package, the cache, or a clear error."""
import pytest

from llmd.engine import fetch


def test_missing_model_path_names_the_fix(tmp_path):
    with pytest.raises(fetch.ModelError, match="does not exist; pass --model"):
        fetch.resolve_model(str(tmp_path / "nope.gguf"))


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(fetch.ModelError, match="not a readable file"):
        fetch.resolve_model(str(tmp_path))


def test_given_path_is_used_as_is(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert fetch.resolve_model(str(path)) == path


def test_cache_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert fetch.cache_dir() == tmp_path / "llmd"


def test_default_model_is_found_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(fetch, "installed_default", lambda: None)
    (tmp_path / "llmd").mkdir()
    (tmp_path / "llmd" / fetch.DEFAULT_FILE).write_bytes(b"GGUF")
    assert fetch.default_model(fetch=False) == tmp_path / "llmd" / fetch.DEFAULT_FILE


def test_absent_default_model_without_fetch_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(fetch, "installed_default", lambda: None)
    with pytest.raises(fetch.ModelError, match="python -m llmd pull"):
        fetch.default_model(fetch=False)
