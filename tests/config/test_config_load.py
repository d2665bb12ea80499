"""Tests for ``dapo_cli.config.load`` and the schema it types against.

YAML file → deep-merged ``--set a.b=c`` overrides (typed from the schema) →
validated ``Config``; unknown keys fail with a did-you-mean; the resolved config
dumps to YAML and reloads to an equal config.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from dapo_cli.config import Config, ConfigError, dump_yaml, flatten, load_config, to_dict
from dapo_cli.config.load import (
    build_config,
    coerce,
    embedded_experiment_path,
    from_dict,
    override_config,
    parse_override,
    read_yaml,
    set_dotted,
    unknown_key_message,
)
from dapo_cli.config.fields import setting
from dapo_cli.config.schema import is_section
from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- the schema


def sections(cls: type = Config, prefix: str = "") -> list[tuple[str, type]]:
    """Every (dotted name, dataclass) section of the schema, Config itself included."""
    out = [(prefix, cls)]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if is_section(hints[f.name]) and hints[f.name] is not TinyModelConfig:
            out.extend(sections(hints[f.name], f"{prefix}.{f.name}" if prefix else f.name))
    return out


def test_every_field_outside_model_tiny_has_one_line_help() -> None:
    checked = 0
    for name, cls in sections():
        for f in dataclasses.fields(cls):
            help_text = f.metadata.get("help")
            assert isinstance(help_text, str) and help_text.strip(), f"{name}.{f.name} has no help"
            assert "\n" not in help_text, f"{name}.{f.name}: help must be one line"
            checked += 1
    assert checked >= 80  # ~90 settings today; guards against the walk silently visiting nothing


def test_model_tiny_is_the_embedded_tiny_model_config() -> None:
    hints = typing.get_type_hints(type(Config().model))
    assert hints["tiny"] is TinyModelConfig
    assert Config().model.tiny == TinyModelConfig()
    assert "model.tiny.hidden_size" in flatten(Config())


def test_choices_are_declared_for_enumerated_settings() -> None:
    fields = {f.name: f for f in dataclasses.fields(type(Config().algorithm))}
    assert fields["loss_agg_mode"].metadata["choices"] == (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    )
    assert fields["clip_ratio_high"].metadata["choices"] is None


def test_list_defaults_are_not_shared_between_instances() -> None:
    a, b = Config(), Config()
    a.eval.pass_k.append(64)
    a.data.train_files.append("x.parquet")
    assert b.eval.pass_k == [1, 8, 32]
    assert b.data.train_files == ["synthetic:add-3digit"]


def test_setting_keeps_a_declared_section_default_and_copies_it() -> None:
    @dataclasses.dataclass
    class Inner:
        n: int = 1
        xs: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass
    class Outer:
        inner: Inner = setting(Inner(n=5, xs=[1]), "a section declared with non-default values")
        names: list[str] = setting(["a"], "a list")

    a, b = Outer(), Outer()
    assert a.inner == Inner(n=5, xs=[1])  # not Inner()
    a.inner.xs.append(2)
    a.names.append("b")
    assert b.inner.xs == [1] and b.names == ["a"]
    assert dataclasses.fields(Outer)[0].metadata["help"] == "a section declared with non-default values"


# ---------------------------------------------------------------- YAML + overrides


def test_empty_yaml_gives_schema_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == Config()
    assert load_config(write(tmp_path, "# only a comment\n")) == Config()


def test_empty_section_in_yaml_means_defaults(tmp_path: Path) -> None:
    # `trainer:` with every key commented out parses to None
    assert load_config(write(tmp_path, "trainer:\n  # lr: 1e-4\n")) == Config()


def test_yaml_values_are_typed_and_unset_keys_keep_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "rollout:\n  n: 4\n  max_response_length: 64\nalgorithm:\n  overlong_buffer:\n    len: 16\n")
    cfg = load_config(path)
    assert cfg.rollout.n == 4 and cfg.rollout.max_response_length == 64
    assert cfg.algorithm.overlong_buffer.len == 16
    assert cfg.algorithm.overlong_buffer.penalty_factor == 1.0  # sibling default kept
    assert cfg.rollout.temperature == 1.0
    assert cfg.trainer == Config().trainer


def test_overrides_deep_merge_over_the_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "rollout:\n  n: 4\n  max_response_length: 64\nalgorithm:\n  overlong_buffer:\n    len: 16\n")
    cfg = load_config(path, ["rollout.n=8", "algorithm.overlong_buffer.penalty_factor=0.5", "trainer.lr=1e-4"])
    assert cfg.rollout.n == 8
    assert cfg.rollout.max_response_length == 64  # merged, not replaced
    assert cfg.algorithm.overlong_buffer.len == 16
    assert cfg.algorithm.overlong_buffer.penalty_factor == 0.5
    assert cfg.trainer.lr == 1e-4  # YAML 1.1 reads "1e-4" as a string; the schema types it
    assert isinstance(cfg.trainer.lr, float)


def test_later_override_of_the_same_key_wins(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), ["rollout.n=4", "rollout.n=6"])
    assert cfg.rollout.n == 6


@pytest.mark.parametrize(
    ("override", "getter", "expected"),
    [
        ("trainer.lr=0.001", lambda c: c.trainer.lr, 0.001),
        ("trainer.total_steps=7", lambda c: c.trainer.total_steps, 7),
        ("trainer.total_steps=7.0", lambda c: c.trainer.total_steps, 7),  # integral float is an int
        ("data.shuffle=no", lambda c: c.data.shuffle, False),
        ("data.shuffle=off", lambda c: c.data.shuffle, False),
        ("data.shuffle=0", lambda c: c.data.shuffle, False),
        ("data.shuffle=TRUE", lambda c: c.data.shuffle, True),
        ("algorithm.clip_ratio_c=3", lambda c: c.algorithm.clip_ratio_c, 3.0),
        ("algorithm.clip_ratio_c=null", lambda c: c.algorithm.clip_ratio_c, None),
        ("algorithm.clip_ratio_c=None", lambda c: c.algorithm.clip_ratio_c, None),
        ("data.train_files=a.parquet,b.parquet", lambda c: c.data.train_files, ["a.parquet", "b.parquet"]),
        ("data.train_files=[a.parquet, b.parquet]", lambda c: c.data.train_files, ["a.parquet", "b.parquet"]),
        ("data.train_files=one.parquet", lambda c: c.data.train_files, ["one.parquet"]),
        ("eval.pass_k=[1, 4]", lambda c: c.eval.pass_k, [1, 4]),
        ("eval.pass_k=2", lambda c: c.eval.pass_k, [2]),
        ("model.tiny.hidden_size=64", lambda c: c.model.tiny.hidden_size, 64),
        ("model.dtype=bfloat16", lambda c: c.model.dtype, "bfloat16"),
        # string settings keep the text typed, not YAML's reading of it
        ("trainer.run_name=001", lambda c: c.trainer.run_name, "001"),
        ("tracking.experiment=on", lambda c: c.tracking.experiment, "on"),
        ("trainer.run_name=1.10", lambda c: c.trainer.run_name, "1.10"),
        ("trainer.run_name='quoted'", lambda c: c.trainer.run_name, "quoted"),
        ("trainer.run_name=", lambda c: c.trainer.run_name, ""),
        ("trainer.run_name=a=b", lambda c: c.trainer.run_name, "a=b"),  # split at the first '='
    ],
)
def test_override_values_are_typed_from_the_schema(tmp_path: Path, override: str, getter, expected) -> None:
    cfg = load_config(write(tmp_path, ""), [override])
    value = getter(cfg)
    assert value == expected
    assert type(value) is type(expected)


def test_override_can_create_a_section_missing_from_the_yaml(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "data:\n  shuffle: false\n"), ["ablate.seeds=3"])
    assert cfg.ablate.seeds == 3
    assert cfg.data.shuffle is False


def test_build_config_types_but_does_not_validate(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    cfg = build_config(path, ["rollout.n=1"])  # n < 2 is a validation error, not a typing one
    assert cfg.rollout.n == 1
    with pytest.raises(ConfigError, match="rollout.n=1"):
        load_config(path, ["rollout.n=1"])
    with pytest.raises(ConfigError, match="must be an integer"):
        build_config(path, ["rollout.n=x"])


# ---------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.lrr=1", "unknown config key 'trainer.lrr'; did you mean 'trainer.lr'?"),
        ("algoritm.x=1", "unknown config key 'algoritm'; did you mean 'algorithm'?"),
        ("algorithm.overlong_bufer.len=3", "did you mean 'algorithm.overlong_buffer'?"),
        ("model.tiny.hidden=64", "unknown config key 'model.tiny.hidden'; did you mean 'model.tiny.hidden_size'?"),
    ],
)
def test_unknown_override_key_suggests_the_closest(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, ""), [override])
    assert message in str(info.value)


def test_unknown_yaml_key_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout\.temprature'; did you mean 'rollout\.temperature'\?"):
        load_config(write(tmp_path, "rollout:\n  temprature: 0.5\n"))


def test_unknown_key_without_a_close_match_lists_valid_keys() -> None:
    message = unknown_key_message("reward", "zzz", ["verifier"])
    assert message == "unknown config key 'reward.zzz'; valid keys in reward: verifier"
    assert unknown_key_message("", "zzz", ["data", "model"]) == "unknown config key 'zzz'; valid keys: data, model"


def test_config_error_is_a_user_error() -> None:
    assert issubclass(ConfigError, UserError)


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.n=2.5", "rollout.n must be an integer, got 2.5"),
        ("rollout.n=abc", "rollout.n must be an integer, got 'abc'"),
        ("rollout.n=true", "rollout.n must be an integer, got True"),
        ("rollout.n=[2]", "rollout.n must be an integer, got [2]"),
        ("data.shuffle=maybe", "data.shuffle must be true or false, got 'maybe'"),
        ("data.shuffle=2", "data.shuffle must be true or false, got 2"),
        ("trainer.lr=fast", "trainer.lr must be a number, got 'fast'"),
        ("trainer.lr=yes", "trainer.lr must be a number, got True"),
        ("engine.name=jax", "engine.name='jax' is not one of: torch, deepspeed"),
        ("algorithm.loss_agg_mode=mean", "algorithm.loss_agg_mode='mean' is not one of: token-mean,"),
        ("trainer.run_name=[a, b]", "trainer.run_name must be a string, got ['a', 'b']"),
        ("eval.pass_k=[1, x]", "eval.pass_k[1] must be an integer, got 'x'"),
        ("trainer=5", "'trainer' must be a mapping of keys, got 5"),
    ],
)
def test_bad_values_name_the_key_and_what_is_expected(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, ""), [override])
    assert message in str(info.value)


def test_override_syntax_errors() -> None:
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        parse_override("trainer.lr")
    with pytest.raises(ConfigError, match="has no key before '='"):
        parse_override(" =3")
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_override("a.b= x ") == ("a.b", "x")
    assert parse_override("a.b=[unclosed") == ("a.b", "[unclosed")  # not YAML: kept as text


def test_set_dotted_refuses_to_descend_into_a_value() -> None:
    data: dict = {"trainer": {"lr": 1.0}}
    set_dotted(data, "trainer.warm.x", 2)
    assert data == {"trainer": {"lr": 1.0, "warm": {"x": 2}}}
    with pytest.raises(ConfigError, match="'trainer.lr' is a value, not a section; cannot set 'trainer.lr.x'"):
        set_dotted(data, "trainer.lr.x", 3)


def test_a_key_given_twice_or_nesting_past_the_stack_is_one_error(tmp_path: Path) -> None:
    # PyYAML alone keeps the later value: the first trainer section (lr) would vanish without a word
    with pytest.raises(ConfigError, match=r"at line 5: key 'trainer' is given twice \(lines 1 and 5\); keep one"):
        read_yaml(write(tmp_path, "trainer:\n  lr: 1.0e-4\ndata:\n  train_batch_size: 4\ntrainer:\n  total_steps: 3\n"))
    with pytest.raises(ConfigError, match=r"key 'lr' is given twice \(lines 1 and 1\)"):
        read_yaml(write(tmp_path, "trainer: {lr: 1, lr: 2}\n"))  # in one flow mapping too
    with pytest.raises(ConfigError, match="nests its values too deeply to read"):
        read_yaml(write(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n"))
    # what is not a duplicate stays as it was: the same key in two sections, a merge key overridden
    assert read_yaml(write(tmp_path, "a: {lr: 1}\nb: {lr: 2}\nc: &X {q: 1}\nd: {<<: *X, q: 2}\n")) == {
        "a": {"lr": 1}, "b": {"lr": 2}, "c": {"q": 1}, "d": {"q": 2}}


def test_numbers_past_pythons_and_int64s_limits_are_one_error(tmp_path: Path) -> None:
    from dapo_cli.config.validate import validate

    # int() of over 4,300 digits raises ValueError inside PyYAML (not a YAMLError): it was a traceback
    with pytest.raises(ConfigError, match=r"holds a value that cannot be read \(Exceeds the limit \(4300 digits\)"):
        read_yaml(write(tmp_path, "trainer:\n  seed: " + "9" * 5000 + "\n"))
    with pytest.raises(ConfigError, match=r"override 'trainer.seed=': the value is a number too long to read \(5,000 characters\)"):
        override_config(Config(), ["trainer.seed=" + "9" * 5000])
    # readable, but past 64 bits: torch.manual_seed overflowed on it
    with pytest.raises(ConfigError, match=r"trainer.seed=1e\+30 is past what 64 bits hold"):
        validate(override_config(Config(), [f"trainer.seed={10**30}"]))
    with pytest.raises(ConfigError, match=r"trainer.total_steps=1e\+30 is past what 64 bits hold"):
        validate(override_config(Config(), [f"trainer.total_steps={10**30}"]))
    validate(override_config(Config(), [f"trainer.seed={2**63 - 1}"]))  # the edge itself is allowed
    # PyYAML's other refusals are not numbers: an impossible date stays text in --set (the schema types it) and
    # is one line in a file
    assert override_config(Config(), ["tracking.experiment=2020-13-45"]).tracking.experiment == "2020-13-45"
    with pytest.raises(ConfigError, match=r"holds a value that cannot be read \(month must be in 1..12\); fix or quote it"):
        read_yaml(write(tmp_path, "tracking:\n  experiment: 2020-13-45\n"))


def test_read_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        read_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"is not valid YAML at line 2: mapping values are not allowed here"):
        read_yaml(write(tmp_path, "data: 1\n  shuffle: 2\n"))
    with pytest.raises(ConfigError, match="must hold a mapping of sections .* not a list"):
        read_yaml(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="is a directory; give a YAML file"):
        load_config(tmp_path)  # a directory is not a config file
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(ConfigError, match="is not a UTF-8 text file"):
        read_yaml(binary)


@pytest.mark.parametrize(
    ("value", "tp", "expected"),
    [
        (3, int, 3),
        ("3", int, 3),
        (3.0, int, 3),
        (2, float, 2.0),
        ("2.5e-3", float, 0.0025),
        (True, bool, True),
        ("yes", bool, True),
        ("1", bool, True),
        ("false", bool, False),
        (1, bool, True),
        (0, bool, False),
        (12, str, "12"),
        (None, str, ""),
        (None, float | None, None),
        ("~", float | None, None),
        ("1.5", float | None, 1.5),
        ("a, b,,c", list[str], ["a", "b", "c"]),
        ((1, "2"), list[int], [1, 2]),
        (5, list[int], [5]),
    ],
)
def test_coerce_every_branch(value, tp, expected) -> None:
    result = coerce(value, tp, "k")
    assert result == expected
    assert type(result) is type(expected)


def test_coerce_rejects_an_unsupported_schema_type() -> None:
    with pytest.raises(TypeError, match="not supported by the loader"):
        coerce(1, dict, "k")


def test_from_dict_rejects_non_mapping_at_the_top() -> None:
    with pytest.raises(ConfigError, match="'config' must be a mapping of keys"):
        from_dict(Config, [1])


# ---------------------------------------------------------------- dump and round trip


def test_dump_then_reload_gives_an_equal_config(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "algorithm.clip_ratio_c=3.0",
            "trainer.run_name=001",
            "tracking.experiment=on",
            "data.train_files=a.parquet,b.parquet",
            "eval.pass_k=[1, 2]",
            "trainer.lr=3e-6",
            "model.tiny.rope_theta=500",
        ],
    )
    text = dump_yaml(cfg)
    again = load_config(write(tmp_path, text, "dump.yaml"))
    assert again == cfg
    assert dump_yaml(again) == text


def test_dump_lists_sections_in_schema_order() -> None:
    data = yaml.safe_load(dump_yaml(Config()))
    assert list(data) == [f.name for f in dataclasses.fields(Config)]
    assert data == to_dict(Config())


def test_flatten_gives_every_leaf_by_dotted_key() -> None:
    flat = flatten(Config())
    assert flat["algorithm.clip_ratio_high"] == 0.28
    assert flat["algorithm.overlong_buffer.len"] == 4096
    assert flat["eval.pass_k"] == [1, 8, 32]
    assert flat["model.tiny.architecture"] == "llama"
    assert not any(dataclasses.is_dataclass(v) for v in flat.values())

    def count(d: dict) -> int:
        return sum(count(v) if isinstance(v, dict) else 1 for v in d.values())

    assert len(flat) == count(to_dict(Config()))


# ---------------------------------------------------------------- the embedded experiment


def test_embedded_experiment_is_experiments_tiny_yaml() -> None:
    path = embedded_experiment_path()
    assert path.is_file()
    assert path.read_text(encoding="utf-8") == (REPO / "experiments" / "tiny.yaml").read_text(encoding="utf-8")


def test_no_path_loads_the_embedded_tiny_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing relative to the working directory may be read
    cfg = load_config()
    assert cfg == load_config(REPO / "experiments" / "tiny.yaml")
    assert cfg != Config()  # the tiny experiment really overrides the paper defaults
    assert cfg.model.path == "builtin:tiny"
    assert cfg.engine.device == "cpu"


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "inf", "nan", "1e999"])
def test_non_finite_numbers_are_rejected_from_yaml_and_overrides(tmp_path: Path, text: str) -> None:
    # trainer.lr=.inf used to pass validation and turn the parameters to inf after one step
    with pytest.raises(ConfigError, match=r"trainer.lr=\S+ is not a finite number; give a finite value"):
        load_config(write(tmp_path, f"trainer:\n  lr: {text}\n"))
    with pytest.raises(ConfigError, match="is not a finite number"):
        load_config(None, [f"trainer.lr={text}"])
