"""The checking commands of `python -m llmd` on the default model."""
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest


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


def test_perplexity_against_f16_scores_the_text_twice_and_reports_the_cost(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat. The dog lay on the rug. " * 40)
    plain = json.loads(run("perplexity", "--file", str(text), "--ctx", "64").stdout)
    result = json.loads(run("perplexity", "--file", str(text), "--ctx", "64", "--kv-type", "q4_0",
                            "--against-f16").stdout)
    assert result["f16_ppl"] == plain["ppl"] and result["tokens_scored"] == plain["tokens_scored"]
    assert result["cost_pct"] == pytest.approx(100 * (result["ppl"] / result["f16_ppl"] - 1), abs=5e-3)
    assert result["cost_stderr_pct"] > 0  # q4_0 moves every window a little, by different amounts
    refused = run("perplexity", "--file", str(text), "--ctx", "64", "--against-f16")
    assert refused.returncode == 2 and "--against-f16 compares a quantized cache" in refused.stderr


def test_cost_over_takes_its_standard_error_over_window_means():
    from llmd.commands.perplexity import cost_over
    exact = [-1.0] * 8
    quantized = [-1.1] * 4 + [-1.3] * 4  # windows that lose 0.1 and 0.3 nats a token
    cost, stderr = cost_over(exact, quantized, 2)
    assert cost == pytest.approx(math.exp(0.2) - 1)
    assert stderr == pytest.approx(0.1 / math.sqrt(2))  # two window means, 0.1 from their mean


def test_perplexity_windows_prepend_bos_and_start_each_window_with_it():
    from llmd.commands.perplexity import perplexity_windows
    ids = list(range(10, 20))
    # As llama-perplexity: BOS before the text, then BOS in place of each later window's first token.
    assert perplexity_windows(ids, 4, 1) == [[1, 10, 11, 12], [1, 14, 15, 16]]
    assert perplexity_windows(ids, 4, None) == [[10, 11, 12, 13], [14, 15, 16, 17]]


def test_tokenize_works_on_a_vocab_only_gguf():
    from tests.reference_data import require
    vocab = require("models/ggml-vocab-llama-bpe.gguf")
    assert json.loads(run("tokenize", "--model", str(vocab), "Hello world").stdout) == [9906, 1917]


def test_a_vocab_only_gguf_cannot_be_run_and_says_so(tmp_path):
    from tests.reference_data import require
    vocab = require("models/ggml-vocab-llama-bpe.gguf")
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat. " * 100)
    result = run("perplexity", "--model", str(vocab), "--file", str(text), "--ctx", "64")
    assert result.returncode == 2
    assert "holds only a vocabulary" in result.stderr and "Traceback" not in result.stderr


def test_an_unsupported_tokenizer_is_a_clear_error_not_a_traceback():
    from tests.reference_data import require
    result = run("tokenize", "--model", str(require("models/ggml-vocab-bert-bge.gguf")), "x")
    assert result.returncode == 2
    assert "unsupported tokenizer model 'bert'" in result.stderr and "Traceback" not in result.stderr


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


# ---- help, LLMD_* variables, the start-up banner, systemd notification ----------------

def _serve_flags(help_text: str) -> list[str]:
    usage = help_text.split("\n\n", 1)[0]
    return [f for f in re.findall(r"\[(--[a-z-]+)", usage) if f != "--help"]


def test_top_level_help_lists_every_serve_flag_with_its_default_and_variable():
    out = run("--help").stdout
    flags = _serve_flags(out)
    assert len(flags) >= 15 and "--log-format" in flags
    options = " ".join(out.split("options:", 1)[1].split())  # unwrap the help lines
    for flag, following in zip(flags, flags[1:] + ["Other"]):
        start = options.index(flag + " ")
        entry = options[start:options.index(following + " ", start)]
        assert "(default:" in entry, flag
        assert f"[env LLMD_{flag[2:].upper().replace('-', '_')}]" in entry, flag
    assert "pull, tokenize, perplexity, bench" in out


def test_help_names_the_program_as_run_and_sizes_as_flags_take_them():
    out = run("--help").stdout
    assert out.startswith("usage: python -m llmd [serve] ")
    options = " ".join(out.split("options:", 1)[1].split())
    assert "largest request body (default: 16M)" in options
    assert "(0: no limit) (default: 4G)" in options
    assert "usage: python -m llmd bench " in run("bench", "--help").stdout


def _other_value(default, choices: list[str]):
    """An LLMD_* value different from a flag's default, and what it should parse to."""
    if isinstance(default, bool):
        return "1", True
    if isinstance(default, (int, float)):  # one below a positive default: a default may be its flag's maximum
        other = default - 1 if default > 0 else default + 1
        return str(other), other
    if isinstance(default, list):
        return "a,b", ["a", "b"]
    if choices:
        other = next(c for c in choices if c != default)
        return other, other
    return "x", "x"


def test_every_serve_flag_reads_its_environment_variable(monkeypatch):
    from llmd import cli

    help_text = run("--help").stdout
    defaults = vars(cli.build_parser().parse_args(["serve"]))
    for flag in _serve_flags(help_text):
        if flag == "--api-key":
            continue  # read when serving, so that --help never shows a key (tests/api/test_access.py)
        dest = flag[2:].replace("-", "_")
        choices = re.search(re.escape(flag) + r" \{([a-z0-9_,]+)\}", help_text)
        raw, expected = _other_value(defaults[dest], choices.group(1).split(",") if choices else [])
        monkeypatch.setenv("LLMD_" + dest.upper(), raw)
        assert getattr(cli.build_parser().parse_args(["serve"]), dest) == expected, flag
        monkeypatch.delenv("LLMD_" + dest.upper())


@pytest.mark.parametrize("variable, value", [("LLMD_PORT", "eighty"), ("LLMD_SESSION_EVICTION", "random"),
                                             ("LLMD_KV_BUDGET", "-1G"), ("LLMD_NO_WARM_RESUME", "maybe")])
def test_a_bad_environment_value_is_a_clear_error(variable, value):
    result = subprocess.run([sys.executable, "-m", "llmd", "--help"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, variable: value})
    assert result.returncode != 0
    assert variable in result.stderr and "Traceback" not in result.stderr


def test_banner_names_the_model_capacity_and_a_curl_that_works_when_pasted():
    from llmd.cli import banner

    info = SimpleNamespace(n_ctx=2048, max_sessions=5, bytes_per_session=47_000_000, n_threads=2, kernels="avx2",
                           kv_type_k="q8_0", kv_type_v="f16")
    text = banner("http://127.0.0.1:8000", "it's-a-model", "/m/it's.gguf", info, 1.25)
    lines = text.splitlines()
    assert lines[0] == "llmd ready on http://127.0.0.1:8000"
    assert "it's-a-model" in lines[1] and "loaded in 1.2s" in lines[1]
    assert "2048 tokens" in text and "4 named sessions" in text and "47 MB" in text
    assert "47 MB of KV cache each (q8_0 keys, f16 values)" in text
    assert "threads   2, avx2 kernels" in text and "http://127.0.0.1:8000/metrics" in text
    assert "speculate prompt lookup (ngram)" in text
    drafted = banner("http://h:1", "m", "/m.gguf", info, 0.1, "draft", "/d/small.gguf", slots=3, draft_bytes=12_000_000)
    assert "speculate draft model small  (/d/small.gguf)" in drafted
    assert "2 named sessions" in drafted and "47 MB of KV cache each (q8_0 keys, f16 values) + 12 MB for its draft" \
        in drafted
    curl = shlex.split(lines[-1].split("try", 1)[1])
    assert curl[:2] == ["curl", "http://127.0.0.1:8000/v1/chat/completions"]
    assert json.loads(curl[curl.index("-d") + 1])["model"] == "it's-a-model"
    single = banner("http://h:1", "m", "/m.gguf", SimpleNamespace(**{**vars(info), "max_sessions": 1}), 0.1)
    assert "anonymous requests only" in single


def test_notify_systemd_reaches_an_abstract_socket(monkeypatch):
    from llmd.cli import notify_systemd

    name = f"llmd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notify_systemd("READY=1")
        assert sock.recv(100) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    notify_systemd("READY=1")  # not under systemd: nothing happens, nothing fails


@pytest.mark.parametrize("host", ["a,b", "no-such-host.invalid"])
def test_a_host_that_cannot_be_bound_is_a_clear_error_not_a_traceback(host):
    result = run("--host", host, "--port", "0")
    assert result.returncode == 2
    assert f"cannot listen on {host}" in result.stderr and "Traceback" not in result.stderr


def test_mtp_drafting_with_a_model_that_has_no_prediction_block_is_a_clear_error():
    result = run("serve", "--speculative", "mtp", "--port", "0")  # the default model has none
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no multi-token-prediction block to draft with" in result.stderr, result.stderr


@pytest.mark.parametrize("flags, message", [
    (("--speculative", "draft"), "--speculative draft needs --draft-model PATH.gguf"),
    (("--speculative", "ngram", "--draft-model", "d.gguf"), "--draft-model drafts only with --speculative draft"),
])
def test_a_draft_model_and_the_draft_mode_go_together(flags, message):
    result = run("serve", *flags)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_draft_model_of_another_vocabulary_is_a_clear_start_up_error(tiny_model):
    result = run("serve", "--port", "0", "--draft-model", str(tiny_model.path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (f"the draft model {tiny_model.path} cannot draft for the model: its vocabulary has 300 tokens, "
            "the model's 49152") in result.stderr, result.stderr


def test_a_draft_model_makes_draft_the_default_drafter():
    from llmd import cli

    assert cli.speculative_mode(cli.build_parser().parse_args(["serve", "--draft-model", "d.gguf"])) == "draft"
    assert cli.speculative_mode(cli.build_parser().parse_args(["serve"])) == "ngram"


def test_draft_max_is_bounded_by_the_engine():
    from llmd import cli

    assert cli.build_parser().parse_args(["serve", "--draft-max", "32"]).draft_max == 32
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--draft-max", "33"])


@pytest.mark.parametrize("args, flag", [
    (("serve", "--port", "70000"), "--port"), (("serve", "--port", "-1"), "--port"),
    (("serve", "--ctx", str(1 << 40)), "--ctx"), (("serve", "--threads", str(1 << 40)), "--threads"),
    (("serve", "--max-sessions", str(1 << 40)), "--max-sessions"), (("serve", "--kv-budget", "9e30"), "--kv-budget"),
    (("tokenize", "--ctx", str(1 << 40), "x"), "--ctx"), (("bench", "--runs", "0"), "--runs"),
    (("bench", "--held-sessions", "-1"), "--held-sessions"),
    (("quantize", "a", "b", "Q8_0", "--threads", "-1"), "--threads"),
])
def test_a_number_beyond_what_the_flag_takes_is_a_usage_error(args, flag):
    # the engine's options are 32-bit ints: 2^40 overflowed them with a traceback
    result = run(*args)
    assert result.returncode == 2 and f"argument {flag}:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("file, message", [("missing.txt", "No such file"), (".", "Is a directory"),
                                           ("latin1.txt", "can't decode")])
def test_perplexity_of_an_unreadable_text_is_one_line(tmp_path, file, message):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 " * 100)
    result = run("perplexity", "--file", str(tmp_path / file))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("ctx", ["0", "2"])
def test_perplexity_windows_too_small_to_score_are_refused(tmp_path, ctx):
    (tmp_path / "t.txt").write_text("words " * 100)
    result = run("perplexity", "--ctx", ctx, "--file", str(tmp_path / "t.txt"))
    assert result.returncode == 2 and "--ctx must be at least 3" in result.stderr


def test_bench_of_a_model_that_does_not_open_is_one_line(tmp_path):
    (tmp_path / "text.gguf").write_text("not a model")
    result = run("bench", "--model", str(tmp_path / "text.gguf"), "--runs", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stderr.startswith("llmd: ")
