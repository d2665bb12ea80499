"""The model-folder door (dapo_cli/models/door.py) and bounded chat templates (chat_template.py,
template_sandbox.py): every damaged or hostile folder is one line naming the file, field and fix; every
hostile template stops within its bounds; every real template renders exactly as transformers renders it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dapo_cli.errors import UserError
from dapo_cli.models import build_char_tokenizer, format_prompt, load_policy
from dapo_cli.models.chat_template import TemplateProblem, render_template, chat_variables
from dapo_cli.models.door import MAX_JSON_DEPTH, config_problem, folder_problem, nonfinite_tensor, read_json_object
from dapo_cli.models.loading import check_model_dir, load_tokenizer
from dapo_cli.models.tokenizer import CHAT_TEMPLATE

USER = [{"role": "user", "content": "What is 1+2?"}]


@pytest.fixture
def folder(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny policy to damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))


def _edit_config(folder: Path, **fields: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))


# ---------------------------------------------------------------- config.json fields


BASE = {"vocab_size": 114, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128, "head_dim": None,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": 3, "eos_token_id": 1, "pad_token_id": 0}

FIELD_CASES = [
    ({"vocab_size": 0}, "vocab_size=0 must be a positive integer"),
    ({"vocab_size": 2**30}, "vocab_size=1,073,741,824 is larger than 4,194,304"),
    ({"hidden_size": True}, "hidden_size=true must be a positive integer"),  # a bool is not a number
    ({"hidden_size": 32.0}, "hidden_size=32.0 must be a positive integer"),
    ({"num_hidden_layers": -1}, "num_hidden_layers=-1 must be a positive integer"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers=1,000,000 is larger than 1,024"),
    ({"num_attention_heads": 0}, "num_attention_heads=0 must be a positive integer"),
    ({"num_key_value_heads": "2"}, "num_key_value_heads=\"2\" must be a positive integer"),
    ({"intermediate_size": None}, "intermediate_size=null must be a positive integer"),
    ({"max_position_embeddings": "lots"}, "max_position_embeddings=\"lots\" must be a positive integer"),
    ({"max_position_embeddings": -1}, "max_position_embeddings=-1 must be a positive integer"),
    ({"head_dim": 0}, "head_dim=0 must be a positive integer"),
    ({"rms_norm_eps": 0}, "rms_norm_eps=0 must be a finite number above 0 and at most 1"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps=nan must be a finite number"),
    ({"layer_norm_eps": "small"}, "layer_norm_eps=\"small\" must be a number"),
    ({"rope_theta": float("inf")}, "rope_theta=inf must be a finite number"),
    ({"rope_parameters": {"rope_theta": -5}}, "rope_parameters.rope_theta=-5 must be a finite number above 0"),
    ({"rope_scaling": [1, 2]}, "rope_scaling=[1, 2] must be an object or null"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings=1 must be true or false"),
    ({"torch_dtype": "float8"}, "torch_dtype=\"float8\" must be one of"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size=30 is not divisible by num_attention_heads=4"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_attention_heads=4 is not divisible by num_key_value_heads=3"),
    ({"eos_token_id": 500}, "eos_token_id=500 is outside the vocabulary (vocab_size=114)"),
    ({"pad_token_id": -1}, "pad_token_id=-1 must be null or a non-negative integer"),
    ({"bos_token_id": [1, "x"]}, "bos_token_id=[1, \"x\"] must be null or a non-negative integer"),
    ({"text_config": {"hidden_size": 0}}, "text_config.hidden_size=0 must be a positive integer"),
    ({"n_head": 0}, "n_head=0 must be a positive integer"),
]


@pytest.mark.parametrize(("fields", "message"), FIELD_CASES, ids=[m.split("=")[0] + "-" + str(i) for i, (_, m) in enumerate(FIELD_CASES)])
def test_each_config_field_is_typed_and_ranged(fields: dict, message: str) -> None:
    problem = config_problem({**BASE, **fields})
    assert problem is not None and problem.startswith(message), problem


def test_a_sane_config_and_the_optional_nulls_pass() -> None:
    assert config_problem(BASE) is None
    assert config_problem({**BASE, "num_key_value_heads": None, "sliding_window": None, "rope_scaling": None, "eos_token_id": [1, 2]}) is None


def test_a_config_field_problem_names_the_file_the_field_and_the_fix(folder: Path) -> None:
    _edit_config(folder, num_attention_heads=0)
    with pytest.raises(UserError) as info:
        check_model_dir(folder)
    assert str(info.value) == (
        f"model config {folder}/config.json: num_attention_heads=0 must be a positive integer; fix the model's config.json"
    )


def test_a_config_describing_far_more_than_its_weights_is_refused_before_loading(folder: Path) -> None:
    _edit_config(folder, vocab_size=2**22, hidden_size=2**16, num_attention_heads=2**6, num_key_value_heads=2**6, head_dim=2**10)
    problem = folder_problem(folder)
    assert problem is not None and "describes at least 274,894,684,160 parameters" in problem.what and "weight files hold" in problem.what


# ---------------------------------------------------------------- JSON files: shape and bounds


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


JSON_DAMAGE = [
    ("list", "[1, 2]", "is a JSON list, not an object"),
    ("not-json", "{'a': 1", "is not valid JSON"),
    ("binary", b"\x1f\x8b\x08\x00\xff\xfe\x00\x80" * 8, "is not UTF-8 text"),
    ("deep-100000", '{"a": ' + _deep(100_000) + "}", f"nests deeper than {MAX_JSON_DEPTH} levels"),  # RecursionError in json
    ("deep-200", '{"a": ' + _deep(200) + "}", f"nests deeper than {MAX_JSON_DEPTH} levels"),  # parses; refused after
]


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json", "tokenizer.json", "generation_config.json"])
@pytest.mark.parametrize(("damage", "content", "why"), JSON_DAMAGE, ids=[d[0] for d in JSON_DAMAGE])
def test_each_json_file_of_a_folder_is_read_within_bounds(folder: Path, file: str, damage: str, content, why: str) -> None:
    target = folder / file
    target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    problem = folder_problem(folder)
    assert problem is not None and f"{file} {why}" in problem.line and "\n" not in problem.line, problem


def test_a_fifo_in_place_of_a_json_file_is_not_opened(folder: Path) -> None:
    import os

    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")  # opening it would block forever
    assert "tokenizer_config.json is a named pipe (FIFO), not a file" in folder_problem(folder).line


def test_an_oversized_json_file_is_not_read(tmp_path: Path) -> None:
    big = tmp_path / "config.json"
    big.write_text('{"a": "' + "x" * 2000 + '"}')
    assert read_json_object(big, max_bytes=1000) == (None, "is larger than 1,000 bytes")


def test_tokenizer_file_shapes_are_checked(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    assert 'tokenizer.json has no "model" object' in folder_problem(folder).line


def test_load_tokenizer_reports_a_list_tokenizer_config_in_one_line(folder: Path) -> None:
    (folder / "tokenizer_config.json").write_text("[]")
    with pytest.raises(UserError, match=r"tokenizer_config.json is a JSON list, not an object; fix or re-save the tokenizer files"):
        load_tokenizer(folder)


def test_a_chat_template_of_the_wrong_type_is_one_line(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": 5}))
    assert "tokenizer_config.json: chat_template=5 must be a string" in folder_problem(folder).line


# ---------------------------------------------------------------- weights


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_at_load_naming_the_tensor(folder: Path, value: float) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    name = sorted(n for n in tensors if "layers.0" in n)[0]
    tensors[name] = torch.full_like(tensors[name], value)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    assert folder_problem(folder) is None  # headers are fine: only the values are bad
    with pytest.raises(UserError) as info:
        load_policy(folder)
    assert f"tensor '{name}' holds NaN/inf values; re-save it from a healthy checkpoint" in str(info.value)


def test_finite_weights_pass(tiny_model_dir: Path) -> None:
    model, _ = load_policy(tiny_model_dir)
    assert nonfinite_tensor(model) is None


# ---------------------------------------------------------------- chat templates: hostile ones stop within bounds

HOSTILE = {
    "loop-1e10": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop-writing": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "huge-string": "{{ 'x' * 10**10 }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "replace-growth": "{% set ns = namespace(s='aa') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('a', 'aa') %}{% endfor %}",
    "center": "{{ 'x'|center(10**10) }}",
    "format-width": "{{ '%999999999999s' % 'x' }}{{ '{:999999999999}'.format('x') }}",
    "macro-fork": "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "set-block": "{% set s %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}{% endset %}",
    "nested-lists": "{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
    "power": "{{ 9 ** (9 ** 9) }}",
    "retain-strings": "{% set ns = namespace() %}" + "".join(f"{{% set ns.a{i} = '\U0001F600' * 999990 ~ '{i}' %}}" for i in range(40)),
    "slices-in-loop": "{% set s = '\U0001F600' * 999999 %}{% set ns = namespace() %}{% for i in range(100000) %}{% set ns.x = s[i:] %}{% endfor %}",
}

PROBE = textwrap.dedent("""
    import json, pathlib, sys, time, types
    import dapo_cli
    # the renderer alone: dapo_cli.models without its __init__ (which imports torch and transformers)
    models = types.ModuleType("dapo_cli.models")
    models.__path__ = [str(pathlib.Path(dapo_cli.__file__).parent / "models")]
    sys.modules["dapo_cli.models"] = models
    from dapo_cli.models.chat_template import TemplateProblem, chat_variables, render_template

    def memory_mb(field):
        status = pathlib.Path("/proc/self/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith(field)).split()[1]) / 1024

    results = {}
    for name, source in json.loads(sys.stdin.read()).items():
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
        before = memory_mb("VmRSS")
        start = time.perf_counter()
        try:
            render_template(source, chat_variables([{"role": "user", "content": "hi"}], {}))
            problem = None
        except TemplateProblem as exc:
            problem = str(exc)
        results[name] = {"problem": problem, "seconds": time.perf_counter() - start, "extra_mb": memory_mb("VmHWM") - before}
    print(json.dumps(results))
""")
"""Renders each template of a JSON object on stdin in this process, one after the other, and prints for
each the problem, the seconds and the peak resident memory above the resident memory before it (Linux:
the peak is reset per template through /proc/self/clear_refs)."""


@pytest.mark.slow
def test_hostile_templates_stop_in_seconds_and_well_under_a_gigabyte() -> None:
    """Each measured in a process of its own that imports the renderer alone: < 30 s and < 1 GB extra each."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure each template's peak memory")
    done = subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(HOSTILE), capture_output=True, text=True, timeout=240, check=True)
    results = json.loads(done.stdout.splitlines()[-1])
    for name, got in results.items():
        assert got["problem"], (name, got)
        assert got["seconds"] < 30 and got["extra_mb"] < 1024, (name, got)
    assert "loop steps" in results["loop-1e10"]["problem"] and "would build a value" in results["huge-string"]["problem"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ raise_exception('roles must alternate') }}", "it raised an error: roles must alternate"),
        ("{% for m in messages %}{{ m.content }", "syntax error at line 1: unexpected '}'"),
        ("{{ messages.__class__.__mro__ }}", "the sandbox refused it (access to attribute '__class__' of 'list' object is unsafe.)"),
        ("{{ ''.__class__.__subclasses__() }}", "the sandbox refused it"),
        ("{% set ns = namespace() %}{% set ns._x = 1 %}", "the sandbox refused it (a namespace attribute may not start with '_'"),
        ("{{ [].append(1) }}", "the sandbox refused it"),
        ("{{ 1 / 0 }}", "it failed (ZeroDivisionError: division by zero)"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "it recursed too deeply"),
        ("{% include 'other.jinja' %}", "it failed (TypeError: no loader for this environment specified)"),
        ("{{ lipsum(10**6) }}", "'lipsum' is undefined"),
        ("{{ raise_exception('\x1b[2Jcleared') }}", "it raised an error: \\x1b[2Jcleared"),
    ],
    ids=["raise", "syntax", "dunder", "subclasses", "namespace-underscore", "mutate", "zero-division", "recursion", "include", "lipsum", "escape"],
)
def test_failing_templates_are_one_short_problem(source: str, message: str) -> None:
    with pytest.raises(TemplateProblem) as info:
        render_template(source, chat_variables(USER, {}))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_template_that_misbehaves_only_on_some_content_is_bounded_when_it_renders(folder: Path) -> None:
    """It passes the door (the probe is harmless), then a prompt with the trigger stops within the bounds."""
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if 'boom' in m.content %}{{ 'x' * 10**12 }}{% endif %}{{ m.content }}{% endfor %}"
    )
    check_model_dir(folder)
    tokenizer = load_tokenizer(folder)
    assert format_prompt(tokenizer, USER) == "What is 1+2?"
    with pytest.raises(UserError) as info:
        format_prompt(tokenizer, [{"role": "user", "content": "boom"}])
    assert str(info.value).startswith(f"chat template of {folder}: '*' would build a value of more than 1,000,000 characters; fix")


@pytest.mark.parametrize("source", ["{{ raise_exception('no') }}", "{% if %}", "{{ 'x' * 10**10 }}"], ids=["raise", "syntax", "huge"])
def test_the_door_renders_the_template_on_a_probe(folder: Path, source: str) -> None:
    (folder / "chat_template.jinja").write_text(source)
    problem = folder_problem(folder)
    assert problem is not None and problem.where == f"chat template of {folder}" and "chat_template.jinja" in problem.fix


def test_a_long_prompt_scales_the_limits() -> None:
    content = "word " * 400_000  # 2 M characters: past the smallest value limit, far inside the scaled one
    text = render_template(CHAT_TEMPLATE, chat_variables([{"role": "user", "content": content}], {"eos_token": "<eos>"}))
    assert text == content + "\n"


# ---------------------------------------------------------------- chat templates: real ones render exactly as before

FEATURES = (  # what real templates use: namespace, loop state, tojson, selectattr, whitespace control, generation tags
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages if m.role == 'system' %}{% set ns.system = ns.system + m.content %}{% endfor -%}"
    "{{ bos_token }}{% if ns.system %}<<SYS>>{{ ns.system | trim }}<</SYS>>\n{% endif %}\n"
    "{% for message in messages | rejectattr('role', 'equalto', 'system') %}\n"
    "  {% if loop.index0 % 2 == 0 and message.role != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}\n"
    "  [{{ loop.index }}/{{ loop.length }}] {{ message['role'] | upper }}: {{ message.content.split('\\n') | join(' / ') }} {{ message['content'][::-1][:5] }}"
    "{% if message.role == 'assistant' %}{% generation %}{{ message.content }}{{ eos_token }}{% endgeneration %}{% endif %}\n"
    "{% endfor %}{{ messages | map(attribute='role') | list | tojson }}|{{ {'k': [1, 2.5, none, true]} | tojson(indent=2) }}\n"
    "{%- if add_generation_prompt %}{{ '%s> ' % 'ASSISTANT' }}{{ '{0:>6}'.format('go') }}{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 1+2?"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Line one\nline two"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b \"quoted\""}, {"role": "user", "content": "Ünïcödé 中文\t"}],
]


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, FEATURES], ids=["tiny", "features"])
def test_templates_render_exactly_as_apply_chat_template(template: str) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    for conversation in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert format_prompt(tokenizer, conversation) == expected
        assert tokenizer(format_prompt(tokenizer, conversation))["input_ids"] == tokenizer(expected)["input_ids"]


@pytest.mark.gguf  # the smollm2_dir fixture imports the GGUF file (the gguf package is in .venv-vllm)
def test_the_smollm2_template_renders_exactly_as_apply_chat_template(smollm2_dir: Path) -> None:
    tokenizer = load_tokenizer(smollm2_dir)
    for conversation in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert format_prompt(tokenizer, conversation) == expected
        assert tokenizer(expected, add_special_tokens=False)["input_ids"] == tokenizer(
            format_prompt(tokenizer, conversation), add_special_tokens=False
        )["input_ids"]
