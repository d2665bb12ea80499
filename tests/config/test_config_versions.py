"""Run configs carry their schema version (``dapo_cli/config/versions.py``): a config saved by an older dapo (the
fixtures in ``older_configs/``, written by this project's own code at two earlier commits) resumes when every key
it lacks has a declared value that does what that dapo did, and is refused naming the key otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dapo_cli.checkpoint import resume_blockers
from dapo_cli.config import dump_saved, load_config, to_dict
from dapo_cli.config.load import build_config, from_dict
from dapo_cli.config.schema import Config, ConfigError, flatten
from dapo_cli.config.versions import ADDED_KEYS, DEFAULT, SCHEMA_VERSION, before_value, declaration, split_version, upgrade

OLDER = Path(__file__).resolve().parent / "older_configs"


def saved(name: str) -> dict:
    return yaml.safe_load((OLDER / name).read_text())


def leaf_keys(data: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        out |= leaf_keys(v, key) if isinstance(v, dict) else {key}
    return out


def test_every_key_added_since_version_1_is_declared_with_a_later_version() -> None:
    """What fails when a setting is added without saying what a run saved before it should do."""
    v1 = leaf_keys(saved("v1.yaml")) - {"schema_version"}
    now = set(flatten(Config()))
    assert v1 - now == set(), "keys were removed or renamed: declare what a saved config holding them means"
    undeclared = sorted(k for k in now - v1 if (declaration(k) is None or declaration(k).since < 2))
    assert undeclared == [], "declare these in ADDED_KEYS (since = the new SCHEMA_VERSION) and bump it"
    assert SCHEMA_VERSION >= max((a.since for a in ADDED_KEYS.values()), default=1)


def test_each_declaration_names_a_key_or_section_and_a_value_the_schema_accepts() -> None:
    keys = set(flatten(Config()))
    for name, added in ADDED_KEYS.items():
        covered = [k for k in keys if k == name or k.startswith(name + ".")]
        assert covered, f"{name} is no key or section of the schema"
        assert 1 <= added.since <= SCHEMA_VERSION and added.why
        for key in covered:
            value = before_value(key)
            data: dict = {}
            node = data
            *sections, leaf = key.split(".")
            for part in sections:
                node = node.setdefault(part, {})
            node[leaf] = value
            assert flatten(from_dict(Config, data))[key] == value, key  # typed as the schema types it
    assert before_value("rollout.max_staleness") == 0 and before_value("model.lora.rank") == 0
    assert before_value("engine.shared_prompt_forward") is False and ADDED_KEYS["engine.shared_prompt_forward"].before is False
    assert ADDED_KEYS["rollout.worker"].before is DEFAULT and before_value("rollout.worker") == "auto"


def test_a_config_saved_before_lora_staleness_and_autocast_upgrades_to_their_old_behaviour() -> None:
    version, data = split_version(saved("4e22362.yaml"))
    upgraded, filled, missing = upgrade(data, version)
    assert version == 0 and missing == []
    # v1.yaml holds every key of version 1; rollout.kv_cache_gib came with version 2, the loss and correction
    # registries' keys and engine.logprob_chunk with version 3
    later = {k for k in flatten(Config()) if declaration(k) is not None and declaration(k).since >= 2}
    assert "rollout.kv_cache_gib" in later and "algorithm.policy_loss" in later and "algorithm.gspo.clip_ratio_low" in later
    assert sorted(filled) == sorted(leaf_keys(saved("v1.yaml")) - leaf_keys(data) - {"schema_version"} | later)
    assert {k: filled[k] for k in ("rollout.max_staleness", "rollout.worker", "model.lora.rank", "engine.autocast",
                                   "model.tiny.sft_loop_frac", "ablate.jobs")} == {
        "rollout.max_staleness": 0, "rollout.worker": "auto", "model.lora.rank": 0, "engine.autocast": "none",
        "model.tiny.sft_loop_frac": 0.0, "ablate.jobs": 1}
    assert upgraded["model"]["lora"]["target_modules"] == ["all-linear"] and upgraded["rollout"]["n"] == data["rollout"]["n"]


def test_a_run_saved_by_an_older_dapo_resumes_with_the_same_settings() -> None:
    current = to_dict(build_config(OLDER / "4e22362.yaml"))  # its own settings, read by this dapo
    assert resume_blockers(saved("4e22362.yaml"), current) == []
    changed = to_dict(build_config(OLDER / "4e22362.yaml", ["rollout.max_staleness=1", "trainer.lr=2e-6"]))
    assert resume_blockers(saved("4e22362.yaml"), changed) == [
        "rollout.max_staleness (not in it: the older dapo that wrote it ran as --set rollout.max_staleness=0 does)",
        "trainer.lr",
    ]


def test_a_missing_key_whose_default_changes_what_the_run_did_blocks_the_resume_naming_it() -> None:
    """Saved before engine.shared_prompt_forward existed: that dapo ran the plain forward."""
    old = saved("18c86c5.yaml")
    assert resume_blockers(old, to_dict(build_config(OLDER / "18c86c5.yaml"))) == [
        "engine.shared_prompt_forward (not in it: the older dapo that wrote it ran as --set engine.shared_prompt_forward=false does)"
    ]
    assert resume_blockers(old, to_dict(build_config(OLDER / "18c86c5.yaml", ["engine.shared_prompt_forward=false"]))) == []


def test_a_key_nothing_fills_blocks_the_resume() -> None:
    current = to_dict(load_config(None))
    no_rollout_n = {**current, "rollout": {k: v for k, v in current["rollout"].items() if k != "n"}}
    assert resume_blockers(no_rollout_n, current) == ["rollout.n (not in it, and no value is known to do what the dapo that wrote it did)"]
    # a version-1 config holds every key version 1 has: one it lacks is not filled, even a declared one
    v1 = {"schema_version": 1, **current, "rollout": {k: v for k, v in current["rollout"].items() if k != "max_staleness"}}
    assert resume_blockers(v1, current) == [
        "rollout.max_staleness (not in it, and no value is known to do what the dapo that wrote it did)"
    ]


def test_a_run_saves_its_schema_version_and_reads_it_back(tmp_path: Path) -> None:
    cfg = load_config(None, ["trainer.lr=3e-6"])
    text = dump_saved(cfg)
    assert text.startswith(f"schema_version: {SCHEMA_VERSION}\n")
    (tmp_path / "config.yaml").write_text(text)
    assert load_config(tmp_path / "config.yaml") == cfg  # a saved config.yaml is a config like any other
    assert resume_blockers(yaml.safe_load(text), to_dict(cfg)) == []


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (SCHEMA_VERSION + 1, f"was written by a newer dapo (config schema {SCHEMA_VERSION + 1}; this one reads up to {SCHEMA_VERSION})"),
        ("one", "schema_version must be a whole number, got 'one'"),
        (-1, "schema_version must be a whole number, got -1"),
    ],
)
def test_a_version_this_dapo_cannot_read_is_one_line(tmp_path: Path, version, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"schema_version": version, "trainer": {"lr": 1e-6}}))
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")):
        build_config(path)
    with pytest.raises(ConfigError, match="the run's config.yaml"):
        resume_blockers(yaml.safe_load(path.read_text()), to_dict(load_config(None)))


def test_a_version_1_config_gets_the_kv_cache_size_of_version_2_and_the_registries_of_version_3_at_their_defaults() -> None:
    version, data = split_version(saved("v1.yaml"))
    upgraded, filled, missing = upgrade(data, version)
    assert version == 1 and missing == []
    assert filled == {
        "rollout.kv_cache_gib": None,
        # version 3: the policy-loss registry (dapo, the only loss before) and the rollout corrections (token_tis)
        "algorithm.policy_loss": "dapo", "algorithm.gspo.clip_ratio_low": 3e-4, "algorithm.gspo.clip_ratio_high": 4e-4,
        "algorithm.cispo.clip_ratio_low": None, "algorithm.cispo.clip_ratio_high": 3.0,
        "algorithm.gmpo.log_clip_low": 0.4, "algorithm.gmpo.log_clip_high": 0.4,
        "algorithm.rollout_is.mode": "token_tis", "algorithm.rollout_is.geo_bound": 1.001,
        "algorithm.rollout_is.opsm_delta": 1e-4,
        "engine.logprob_chunk": 1024,  # version 3 too: how the head is computed, not what (its default)
        # version 4: vLLM's serving dtype (auto: model.dtype on CPU, as before) and its check after each sync
        "rollout.dtype": "auto", "rollout.sync_check_gap": 0.5,
        "engine.optimizer": "torch",  # version 4: which AdamW implementation steps, not the update (its default)
        # version 5: the slurm launcher's time-limit warning, requeues and polling (not what a child trains)
        "ablate.slurm.signal_delay_s": 300, "ablate.slurm.max_requeues": 3, "ablate.slurm.poll_s": 30.0,
    }
    assert upgraded["rollout"]["kv_cache_gib"] is None and upgraded["algorithm"]["policy_loss"] == "dapo"


def test_a_damaged_config_whose_section_is_a_value_blocks_the_resume_instead_of_crashing_the_upgrade() -> None:
    old = saved(sorted(p.name for p in OLDER.glob("*.yaml"))[0])
    old["rollout"], old[7] = 5, "x"  # what an edited config.yaml may hold: a section that is a number, a key that is none
    blockers = resume_blockers(old, to_dict(load_config(None)))  # rollout.* keys added since would be filled into it
    assert "rollout" in blockers and "7" in blockers
    assert "rollout.max_staleness (not in it, and no value is known to do what the dapo that wrote it did)" in blockers
