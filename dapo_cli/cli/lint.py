"""`dapo lint`: compare a resolved config with the DAPO paper and known pitfalls.

The rules live in :mod:`dapo_cli.config.lint`; this module resolves the config exactly as
``dapo train`` does (YAML → ``--set`` → technique toggles → validation) and prints.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dapo_cli.cli.common import Panel, SetOption
from dapo_cli.cli.options import (
    ClipHigherToggle,
    ConfigArg,
    DynamicSamplingToggle,
    OverlongFilteringToggle,
    OverlongShapingToggle,
    TokenLevelLossToggle,
    resolve,
)
from dapo_cli.config.techniques import Techniques
from dapo_cli.config import lint as rules

EXAMPLES = [
    ("dapo lint experiments/dapo-qwen2.5-32b.yaml", "The paper's setup: no findings, exit 0."),
    ("dapo lint experiments/tiny.yaml --strict", "Exit 1: the tiny experiment has warnings."),
    ("dapo lint experiments/dapo-qwen2.5-7b.yaml --no-dynamic-sampling --set trainer.lr=1e-4 --json", "Two warnings, as JSON."),
]


def lint(
    config: ConfigArg = None,
    sets: SetOption = None,
    clip_higher: ClipHigherToggle = None,
    dynamic_sampling: DynamicSamplingToggle = None,
    token_level_loss: TokenLevelLossToggle = None,
    overlong_shaping: OverlongShapingToggle = None,
    overlong_filtering: OverlongFilteringToggle = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on any finding, warnings included (for CI).", rich_help_panel=Panel.OUTPUT)] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as a JSON list instead of lines.", rich_help_panel=Panel.OUTPUT)] = False,
) -> None:
    """Check a config against the DAPO paper and known pitfalls: one line per finding.

    Each line reads SEVERITY KEY: what is wrong — how to fix it, then the rule's id in
    brackets; a summary line ends the list. ERROR: the config breaks the paper's method
    (e.g. the KL term on); WARN: questionable or not the paper's choice (e.g. a technique
    off). Exit code 0 when there is no error-level finding, 1 when there is one (with
    --strict: 1 on any finding), 2 when the config cannot be loaded. The config is resolved
    as dapo train resolves it: YAML, then --set, then the technique toggles.
    """
    cfg = resolve(config, sets, Techniques(clip_higher=clip_higher, dynamic_sampling=dynamic_sampling,
                                           token_level_loss=token_level_loss, overlong_shaping=overlong_shaping,
                                           overlong_filtering=overlong_filtering))
    findings = rules.lint(cfg)
    if as_json:
        typer.echo(json.dumps(rules.findings_json(findings), indent=2, ensure_ascii=False))
    else:
        for finding in findings:
            typer.echo(finding.line())
        typer.echo(rules.summary(findings))
    code = rules.exit_code(findings, strict=strict)
    if code:
        raise typer.Exit(code=code)
