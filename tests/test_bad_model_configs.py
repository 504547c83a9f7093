"""Nonsense or unsupported config.json files and model names: one line on stderr, exit 2, never an estimate."""

import json

import pytest

from estimator.interface import cli
from estimator.model.architecture import MODEL_TYPES, ConfigError, from_config

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
BERT = {
    "model_type": "bert",
    "architectures": ["BertForMaskedLM"],
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "vocab_size": 30522,
}


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def _one_line_error(capsys, argv, *needles):
    code, out, err = _run(capsys, *argv)
    assert code == 2, out
    assert len(err) == 1 and err[0].startswith("vram-estimate: error: "), err
    for n in needles:
        assert n in err[0], err[0]
    assert out == ""
    return err[0]


def test_a_valid_config_still_estimates(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    code, out, _ = _run(capsys, "--model", str(path), "--json")
    assert code in (0, 1)
    assert json.loads(out)["peak_allocated_bytes"] > 2 * 4 * 256 * 1000  # at least both fp32 embeddings


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"hidden_size": -4096}, ["hidden_size = -4096", "integers from 1"]),
        ({"hidden_size": 4096.0}, ["hidden_size = 4096.0"]),  # a float is refused, not truncated
        ({"hidden_size": 255.9}, ["hidden_size = 255.9"]),
        ({"hidden_size": True}, ["hidden_size = True"]),
        ({"hidden_size": "4096"}, ["hidden_size = '4096'"]),
        ({"hidden_size": 2**40}, ["hidden_size = 1099511627776"]),
        ({"num_hidden_layers": 0}, ["num_hidden_layers = 0"]),
        ({"num_attention_heads": 0}, ["num_attention_heads = 0"]),
        ({"num_key_value_heads": 3}, ["not a multiple of num_key_value_heads = 3"]),
        ({"vocab_size": None, "model_type": "llama"}, ["no 'vocab_size'"]),
        ({"intermediate_size": -1}, ["intermediate_size = -1"]),
        ({"head_dim": 0}, ["head_dim = 0"]),
        ({"max_position_embeddings": -5}, ["max_position_embeddings = -5"]),
        ({"tie_word_embeddings": "false"}, ["tie_word_embeddings = 'false'", "true or false"]),
        ({"model_type": "bert"}, ["model_type 'bert'", "supported: " + ", ".join(MODEL_TYPES)]),
        ({"model_type": None}, ["without model_type"]),
        ({"model_type": "t5"}, ["model_type 't5'"]),
        ({"model_type": "gemma3"}, ["model_type 'gemma3'"]),  # multimodal wrapper: vision tower not modelled
        ({"text_config": [1]}, ["text_config is not an object"]),
    ],
)
def test_nonsense_fields_are_one_line_errors(tmp_path, capsys, change, needles):
    cfg = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    _one_line_error(capsys, ["--model", str(path)], *needles)


def test_bert_is_refused_naming_the_supported_architectures(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BERT))
    _one_line_error(capsys, ["--model", str(path)], "model_type 'bert'", "llama", "qwen2")


@pytest.mark.parametrize(
    "text, needle",
    [
        ('{"model_type": "llama", "hidden_size": 1e400}', "hidden_size = inf"),
        ('{"model_type": "llama", "hidden_size": NaN}', "hidden_size = nan"),
        ('{"model_type": "llama", "hidden_size": -Infinity}', "hidden_size = -inf"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("[1, 2]", "JSON list"),
        ("", "not valid JSON"),
    ],
)
def test_unparseable_or_non_finite_json(tmp_path, capsys, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    _one_line_error(capsys, ["--model", str(path)], needle)


@pytest.mark.parametrize(
    "data, needle",
    [
        (bytes(range(256)) * 4, "not UTF-8"),
        ('{"model_type": "llamä"}'.encode("latin-1"), "not UTF-8"),
        (b"\x00\x00\x00{}", "not valid JSON"),
    ],
)
def test_binary_or_non_utf8_config_json(tmp_path, capsys, data, needle):
    path = tmp_path / "config.json"
    path.write_bytes(data)
    _one_line_error(capsys, ["--model", str(path)], needle)
    _one_line_error(capsys, ["--model", str(tmp_path)], needle)  # the folder holding it


@pytest.mark.parametrize("name", ["x" * 256, "a/" * 300, "Qwen/" + "q" * 5000, "bad\x00name"])
def test_absurd_model_names(capsys, name):
    err = _one_line_error(capsys, ["--model", name])
    assert len(err) < 400  # the name is shown cut, not in full


def test_from_config_itself_refuses_without_the_cli():
    with pytest.raises(ConfigError, match="num_hidden_layers = 0"):
        from_config({**LLAMA, "num_hidden_layers": 0})
    with pytest.raises(ConfigError, match="num_experts_per_tok = 0"):
        from_config({**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 0})


@pytest.mark.parametrize(
    "section, needle",
    [
        ("gptq", "quantization_config is a JSON str"),
        ([1, 2], "quantization_config is a JSON list"),
        ({"quant_method": 5}, "quant_method 5: expected text"),
        ({"quant_method": "gptq", "bits": "four"}, "bits 'four': gptq packs 2, 3, 4, 8 bits"),
        ({"quant_method": "gptq", "bits": 10**30}, "gptq packs 2, 3, 4, 8 bits"),
        ({"quant_method": "gptq", "bits": True}, "bits True"),
        ({"quant_method": "awq", "bits": 8}, "awq packs 4 bits"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size 0: expected -1 or 1 to 65536"),
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 1.5}, "group_size 1.5"),
    ],
)
def test_a_quantization_config_no_loader_accepts_is_one_line(tmp_path, capsys, section, needle):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"quantization_config": section}))
    with pytest.raises(ConfigError, match=None) as e:
        from_config(json.loads(path.read_text()))
    assert needle in str(e.value)
    for argv in (["--model", str(path), "--lora"], ["--model", "0.5B", "--reward-model", str(path)]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and len(err) == 1 and needle in err[0], err


def test_valid_packed_checkpoints_still_size():
    gptq = from_config(
        LLAMA | {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    )
    awq = from_config(
        LLAMA | {"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": -1}}
    )
    assert gptq.total_params == awq.total_params == from_config(LLAMA).total_params
