"""The checking commands of `python -m llmd` on the default model."""
import json
import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmd", *args], capture_output=True, text=True, timeout=300)


def test_tokenize_prints_ids_as_json():
    assert json.loads(run("tokenize", "Hello world! 123").stdout) == [19556, 905, 17, 216, 33, 34, 35]


def test_tokenize_special_recognises_control_tokens():
    assert json.loads(run("tokenize", "--special", "<|im_start|>user").stdout) == [1, 4093]
    assert json.loads(run("tokenize", "<|im_start|>user").stdout)[0] != 1


def test_perplexity_reports_ppl_tokens_and_speed(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat. The dog lay on the rug. " * 40)
    result = json.loads(run("perplexity", "--file", str(text), "--ctx", "64").stdout)
    assert set(result) == {"ppl", "tokens_scored", "tok_s"}
    assert 1.0 < result["ppl"] < 20.0  # a repetitive text is easy to predict
    assert result["tokens_scored"] % 31 == 0  # 31 scored per 64-token window


def test_missing_model_is_a_clear_error_not_a_traceback(tmp_path):
    result = run("tokenize", "--model", str(tmp_path / "missing.gguf"), "x")
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_help_lists_serve_flags_with_defaults():
    out = run("serve", "--help").stdout
    for flag in ("--model", "--port", "--ctx", "--threads", "--max-sessions", "--kv-budget",
                 "--session-eviction", "--no-warm-resume", "--scratch-reuse", "--model-alias"):
        assert flag in out
    assert "default: 8000" in out
