"""The engine protocols (and the round sources') are complete: every implementation declares every member, and nothing in the
package reads a protocol member with ``getattr`` (a member some engines lack would hide there)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import dapo_cli
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.rollout.base import RolloutEngine
from dapo_cli.tracking.base import Tracker

PACKAGE = Path(dapo_cli.__file__).parent


def members(protocol: type) -> set[str]:
    """A protocol's methods and annotated data members (not its dunders)."""
    names = {name for name in vars(protocol) if not name.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


def declared(cls: type) -> set[str]:
    """What a class declares: class attributes (its bases' too), and ``self.x = ...`` in any of its methods."""
    names = {name for klass in cls.__mro__ for name in vars(klass)}
    for klass in cls.__mro__:
        if klass is object:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self":
                names.add(node.attr)
    return names


def implementations() -> list[tuple[type, type]]:
    from dapo_cli.engine.deepspeed import DeepSpeedEngine
    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.rollout.fast import FastRolloutEngine
    from dapo_cli.rollout.hf import HFRolloutEngine
    from dapo_cli.rollout.vllm import VLLMRolloutEngine  # imports vLLM only when an engine is built
    from dapo_cli.train.rounds import InlineRounds, RoundSource, WorkerRounds
    from dapo_cli.tracking.background import BackgroundTracker
    from dapo_cli.tracking.base import NullTracker
    from dapo_cli.tracking.mlflow import MlflowTracker

    return [
        (RolloutEngine, FastRolloutEngine), (RolloutEngine, HFRolloutEngine), (RolloutEngine, VLLMRolloutEngine),
        (TrainingEngine, TorchEngine), (TrainingEngine, DeepSpeedEngine),
        (Tracker, MlflowTracker), (Tracker, NullTracker), (Tracker, BackgroundTracker),
        (RoundSource, InlineRounds), (RoundSource, WorkerRounds),
    ]


@pytest.mark.parametrize(("protocol", "cls"), implementations(), ids=lambda c: c.__name__)
def test_every_implementation_declares_every_protocol_member(protocol, cls):
    missing = members(protocol) - declared(cls)
    assert not missing, f"{cls.__name__} lacks {sorted(missing)} of {protocol.__name__}"


def test_the_protocols_declare_what_the_loop_reads():
    # the members that used to be read with getattr(..., default) because only some engines had them
    assert {"seeds_per_prompt", "lockstep", "check_prompts", "close"} <= members(RolloutEngine)
    assert {"tracking_uri", "run_id", "flush"} <= members(Tracker)


@pytest.mark.slow
def test_no_protocol_member_is_read_with_getattr():
    protocol_names = members(RolloutEngine) | members(TrainingEngine) | members(Tracker)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in protocol_names:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.func.id}(…, {node.args[1].value!r})")
    assert not found, "protocol members read around the protocol:\n" + "\n".join(found)


def test_the_background_tracker_forwards_nothing_it_does_not_declare():
    from dapo_cli.tracking.background import BackgroundTracker

    assert "__getattr__" not in vars(BackgroundTracker)
