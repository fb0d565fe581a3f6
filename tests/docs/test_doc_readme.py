"""The README stays a front door: small, and its test command the one CI runs."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_stays_under_12_kb():
    assert README.stat().st_size < 12_000, "move detail into docs/ and link to it"


def test_the_readme_test_command_is_the_one_ci_runs():
    command = next(line for line in README.read_text(encoding="utf-8").splitlines()
                   if line.startswith("pip install -e '.[test]'"))
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
