"""``dapo lint``: lines and summary on stdout, exit codes (0 / 1 / --strict / 2), --json,
the same --set and technique toggles as ``dapo train``, and a --help that ends with examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_cli.cli import app

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
PAPER = str(EXPERIMENTS / "dapo-qwen2.5-32b.yaml")
TINY = str(EXPERIMENTS / "tiny.yaml")
TINY_WARNINGS = [
    "WARN algorithm.overlong_filter: ",
    "WARN validation.top_p: ",
]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from an empty directory: configs come from explicit paths or the package."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str):
    return CliRunner().invoke(app, ["lint", *args], env={"COLUMNS": "200"})


def lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


@pytest.mark.parametrize("preset", ["dapo-qwen2.5-32b.yaml", "dapo-qwen2.5-7b.yaml", "dapo-qwen2.5-1.5b.yaml"])
@pytest.mark.slow
def test_paper_presets_are_clean_even_when_strict(preset: str) -> None:
    for extra in ([], ["--strict"]):
        result = invoke(str(EXPERIMENTS / preset), *extra)
        assert result.exit_code == 0, result.output
        assert lines(result) == ["no findings"]


@pytest.mark.slow
def test_warnings_exit_0_and_strict_exits_1() -> None:
    result = invoke(TINY)
    assert result.exit_code == 0, result.output
    out = lines(result)
    assert len(out) == 3
    for line, start in zip(out, TINY_WARNINGS):
        assert line.startswith(start)
    assert out[0].endswith("[overlong-filter-with-shaping]")
    assert out[1].endswith("[eval-tied-to-rollout]")
    assert out[-1] == "2 findings (0 errors, 2 warnings)"
    strict = invoke(TINY, "--strict")
    assert strict.exit_code == 1
    assert lines(strict) == out


@pytest.mark.slow
def test_without_config_lints_the_embedded_tiny_experiment() -> None:
    assert lines(invoke()) == lines(invoke(TINY))


def test_an_error_exits_1() -> None:
    result = invoke(PAPER, "--set", "algorithm.use_kl_loss=true")
    assert result.exit_code == 1
    out = lines(result)
    assert out[0].startswith("ERROR algorithm.use_kl_loss: ")
    assert out[0].endswith("[kl-on]")
    assert out[-1] == "1 finding (1 error, 0 warnings)"


@pytest.mark.parametrize(("cpuinfo", "machine_line"), [("flags\t: fpu avx2", True), ("flags\t: fpu avx2 avx512_bf16", False)])
def test_bf16_autocast_on_cpu_is_judged_on_the_machine_running_lint(monkeypatch, cpuinfo: str, machine_line: bool) -> None:
    import dapo_cli.config.lint as lint_module
    from dapo_cli.hardware import parse_cpu_bf16

    monkeypatch.setattr(lint_module, "cpu_bf16", lambda: parse_cpu_bf16(cpuinfo))  # the only read of the machine
    out = lines(invoke(TINY, "--set", "engine.autocast=bfloat16"))
    ids = [line.rsplit("[", 1)[1].rstrip("]") for line in out[:-1]]
    # tiny.yaml: 2 optimizer steps per batch, 64-row micro-batches of 8-row groups: the PPO ratio finding either way
    assert ids == ["overlong-filter-with-shaping", "eval-tied-to-rollout", "autocast-ratio"] + (["bf16-emulated-cpu"] if machine_line else [])
    if machine_line:
        assert out[-2].startswith("WARN engine.autocast: this machine's CPU (the one running dapo lint: no avx512_bf16")


@pytest.mark.slow
def test_technique_toggles_are_applied_before_linting(tmp_path: Path) -> None:
    off = invoke(PAPER, "--no-dynamic-sampling")
    assert off.exit_code == 0
    assert lines(off)[0].startswith("WARN algorithm.filter_groups.enable: ")
    assert lines(off)[0].endswith("[technique-off]")
    assert invoke(PAPER, "--no-dynamic-sampling", "--strict").exit_code == 1
    # a toggle can also clear a finding: the tiny experiment without overlong filtering
    fixed = invoke(TINY, "--no-overlong-filtering")
    assert [line.split(":")[0] for line in lines(fixed)] == ["WARN validation.top_p", "1 finding (0 errors, 1 warning)"]
    # --clip-higher turns an equal-epsilon config back into the paper's 0.28 ...
    data = yaml.safe_load(Path(PAPER).read_text(encoding="utf-8"))
    data["algorithm"]["clip_ratio_high"] = data["algorithm"]["clip_ratio_low"]
    equal = tmp_path / "equal.yaml"
    equal.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert lines(invoke(str(equal), "--clip-higher")) == ["no findings"]
    # ... but contradicting a --set of the same command is an error naming both
    clash = invoke(PAPER, "--set", "algorithm.clip_ratio_high=0.2", "--clip-higher")
    assert clash.exit_code == 2
    assert lines(clash)[0].startswith("error: --clip-higher contradicts --set algorithm.clip_ratio_high=0.2")


@pytest.mark.slow
def test_json_lists_the_findings() -> None:
    result = invoke(PAPER, "--set", "algorithm.use_kl_loss=true", "--set", "rollout.top_k=20", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert [(d["id"], d["severity"], d["key"]) for d in data] == [
        ("kl-on", "error", "algorithm.use_kl_loss"),
        ("rollout-truncated-sampling", "warn", "rollout.top_k"),
    ]
    assert set(data[0]) == {"id", "severity", "key", "message", "fix"}
    clean = invoke(PAPER, "--json")
    assert clean.exit_code == 0 and json.loads(clean.output) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["missing.yaml"], "config file not found: missing.yaml"),
        ([PAPER, "--set", "trainer.lrr=1e-6"], "did you mean 'trainer.lr'?"),
        ([PAPER, "--set", "rollout.n=1"], "rollout.n=1"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], fragment: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    out = lines(result)
    assert len(out) == 1 and out[0].startswith("error: ") and fragment in out[0]
    assert "Traceback" not in result.output


def test_help_documents_exit_codes_options_and_ends_with_examples() -> None:
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Usage: dapo lint" in text
    for option in ("--strict", "--json", "--set", "--clip-higher", "--no-dynamic-sampling", "--no-overlong-filtering"):
        assert option in text
    assert "Exit code 0 when there is no error-level finding, 1 when there is one (with --strict: 1 on any finding), 2" in text
    from dapo_cli.cli.lint import EXAMPLES

    examples = [line.strip() for line in result.output.splitlines() if line.strip().startswith("dapo lint ")]
    assert examples == [command for command, _ in EXAMPLES]
    assert result.output.rstrip().splitlines()[-1].strip() == EXAMPLES[-1][1]  # the help ends with them
    assert text.index("Examples") > text.index("--help")


@pytest.mark.slow
def test_help_examples_do_what_they_say() -> None:
    assert invoke(PAPER).exit_code == 0
    assert invoke(TINY, "--strict").exit_code == 1
    result = invoke(str(EXPERIMENTS / "dapo-qwen2.5-7b.yaml"), "--no-dynamic-sampling", "--set", "trainer.lr=1e-4", "--json")
    assert result.exit_code == 0
    assert [d["id"] for d in json.loads(result.output)] == ["technique-off", "lr-range"]
