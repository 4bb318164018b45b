"""The workload catalogue (`models/*.json`) and the importers that create it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import MODELS_DIR, load_workload_file
from chameleon_opt.workload.importers import (
    architecture_from_hf_config,
    architecture_from_sailor_config,
    import_sailor_profiles,
    load_hf_config,
    main,
)
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import Architecture

REPO = Path(__file__).resolve().parents[1]
SAILOR = REPO.parent / "shared" / "data" / "sailor"

EXPECTED_BLOCKS = {
    "gpt3-1.7b": 24, "gpt3-3.6b": 30, "gpt3-7.5b": 36, "gpt3-18b": 40, "gpt3-39b": 48, "gpt3-76b": 60,
    "gpt3-145b": 80, "gpt3-175b": 96, "gpt3-310b": 96, "gpt3-530b": 105, "gpt3-1t": 128,
    "llama2-7b": 32, "llama2-13b": 40, "llama2-70b": 80, "llama3-8b": 32, "llama3-70b": 80, "llama3-405b": 126,
    "opt-350m": 24, "opt-30b": 48, "gpt-neo-2.7b": 32, "tiny-gpt-cpu": 4,
}


def params_billions(name: str) -> float:
    return Workload(load_workload_file(MODELS_DIR / f"{name}.json"), None, 2).unique_params / 1e9


def test_catalogue_is_complete() -> None:
    assert sorted(p.stem for p in MODELS_DIR.glob("*.json")) == sorted(EXPECTED_BLOCKS)


@pytest.mark.parametrize("name", sorted(EXPECTED_BLOCKS))
def test_every_model_loads_with_its_layer_count(name: str) -> None:
    spec = load_workload_file(MODELS_DIR / f"{name}.json")
    assert spec.name == name
    assert spec.source
    assert spec.architecture is not None and spec.architecture.layers == EXPECTED_BLOCKS[name]
    workload = Workload(spec, None, 2)
    assert workload.num_layers == EXPECTED_BLOCKS[name] + 2
    for profile in spec.profiles:
        assert profile.source
        for per_tp in profile.times.values():
            for rows in per_tp.values():
                assert len(rows) == workload.num_layers


@pytest.mark.parametrize(("name", "nominal"), [
    ("gpt3-175b", 175.0), ("llama3-405b", 405.0), ("llama2-7b", 6.74), ("opt-350m", 0.35)])
def test_parameter_counts_near_nominal(name: str, nominal: float) -> None:
    assert params_billions(name) == pytest.approx(nominal, rel=0.03)


def test_profiled_models_have_their_gpus() -> None:
    expected = {"opt-350m": 7, "gpt-neo-2.7b": 3, "llama3-8b": 3, "opt-30b": 3}
    for name, count in expected.items():
        assert len(load_workload_file(MODELS_DIR / f"{name}.json").profiles) == count


# -- Sailor importer ----------------------------------------------------------------------------


def write_sailor_folder(folder: Path) -> dict[str, dict[str, dict[str, list[float]]]]:
    """A 12-layer profile written with its layer keys out of numeric order ("10" before "2")."""
    folder.mkdir()
    rows = {str(i): [0.001 * (i + 1), 0.002 * (i + 1) + 1e-7, 0.5] for i in range(12)}
    shuffled = {k: rows[k] for k in sorted(rows)}  # lexical: "0", "1", "10", "11", "2", ...
    assert list(shuffled)[:3] == ["0", "1", "10"]
    data = {"2": {"1": shuffled, "4": shuffled}, "1": {"2": shuffled}}
    (folder / "GH-96.json").write_text(json.dumps(data))
    (folder / "V100-16.json").write_text(json.dumps({"1": {"1": shuffled}}))
    return data


def test_sailor_round_trip_orders_layers_by_integer(tmp_path: Path) -> None:
    data = write_sailor_folder(tmp_path / "TOY")
    profiles = import_sailor_profiles(tmp_path / "TOY")
    assert [p.device_type for p in profiles] == ["GH-96", "V100-16"]
    gh = profiles[0]
    assert set(gh.times) == {"1", "2"} and set(gh.times["2"]) == {"1", "4"}
    for mbs, per_tp in data.items():
        for tp, rows in per_tp.items():
            assert [list(r) for r in gh.times[mbs][tp]] == [rows[str(i)] for i in range(12)]
    assert gh.times["2"]["1"][10] == (0.011, 0.022 + 1e-7, 0.5)
    assert "TOY/GH-96.json" in gh.source


def test_sailor_merge_final_norm(tmp_path: Path) -> None:
    write_sailor_folder(tmp_path / "TOY")
    rows = import_sailor_profiles(tmp_path / "TOY", merge_final_norm=True)[0].times["1"]["2"]
    assert len(rows) == 11
    assert rows[-1] == pytest.approx((0.011 + 0.012, 0.022 + 0.024 + 2e-7, 0.5))


@pytest.mark.parametrize(("rows", "field"), [
    ({"0": [1.0, 2.0, 3.0], "2": [1.0, 2.0, 3.0]}, "['1']['1']"),  # gap in layer indices
    ({"0": [1.0, 2.0], "1": [1.0, 2.0, 3.0]}, "['1']['1']['0']"),  # two times, not three
    ({"0": [1.0, -2.0, 3.0], "1": [1.0, 2.0, 3.0]}, "['1']['1']['0']"),  # negative
    ({"0": [1.0, "x", 3.0], "1": [1.0, 2.0, 3.0]}, "['1']['1']['0']"),  # not a number
    ({"a": [1.0, 2.0, 3.0]}, "['1']['1']['a']"),  # layer key not an integer
])
def test_sailor_rejects_malformed_rows(tmp_path: Path, rows: dict, field: str) -> None:
    folder = tmp_path / "BAD"
    folder.mkdir()
    (folder / "A100-40.json").write_text(json.dumps({"1": {"1": rows}}))
    with pytest.raises(InputError) as err:
        import_sailor_profiles(folder)
    assert err.value.field == field
    assert err.value.file.endswith("A100-40.json")


def test_sailor_rejects_bad_keys_and_empty_folder(tmp_path: Path) -> None:
    folder = tmp_path / "BAD"
    folder.mkdir()
    with pytest.raises(InputError, match="no <GPU>.json"):
        import_sailor_profiles(folder)
    (folder / "A100-40.json").write_text(json.dumps({"0": {"1": {"0": [1, 2, 3]}}}))
    with pytest.raises(InputError, match="not a positive integer"):
        import_sailor_profiles(folder)
    (folder / "A100-40.json").write_text("{ not json")
    with pytest.raises(InputError, match="malformed JSON"):
        import_sailor_profiles(folder)


def sailor_data() -> Path:
    if not SAILOR.is_dir():
        pytest.skip(f"Sailor data not present at {SAILOR}")
    return SAILOR


def test_catalogue_matches_sailor_measurements() -> None:
    """The committed profiles are Sailor's numbers, unchanged (Llama: norm row folded into the head)."""
    sailor = sailor_data()
    cases = [("opt-350m", "OPT-350", False, ()), ("gpt-neo-2.7b", "GPT-Neo-2.7", False, ("GH-96",)),
             ("llama3-8b", "LLAMA-3-8", True, ()), ("opt-30b", "OPT-30", False, ())]
    for name, folder, merge, skip in cases:
        imported = import_sailor_profiles(sailor / "profiles" / folder, merge, skip)
        stored = load_workload_file(MODELS_DIR / f"{name}.json").profiles
        assert [p.times for p in imported] == [p.times for p in stored], name


def test_sailor_config_architecture() -> None:
    config = json.loads((sailor_data() / "configs" / "training_config_opt_350.json").read_text())
    arch = architecture_from_sailor_config(config)
    assert arch == load_workload_file(MODELS_DIR / "opt-350m.json").architecture


# -- Hugging Face importer ----------------------------------------------------------------------

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
             "tie_word_embeddings": False, "rms_norm_eps": 1e-05}
GPT2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None, "n_positions": 1024,
        "vocab_size": 50257}


def test_hf_llama() -> None:
    config = dict(LLAMA2_7B, num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                  intermediate_size=28672)
    assert architecture_from_hf_config(config) == Architecture(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000, seq_len=4096,
        gated_mlp=True, learned_positions=False, tied_embeddings=False)


def test_hf_gpt2_opt_gpt_neo() -> None:
    assert architecture_from_hf_config(GPT2) == Architecture(
        layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, seq_len=1024,
        gated_mlp=False, learned_positions=True, tied_embeddings=True)
    opt = {"model_type": "opt", "num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
           "ffn_dim": 4096, "max_position_embeddings": 2048, "vocab_size": 50272}
    assert architecture_from_hf_config(opt) == Architecture(
        layers=24, hidden=1024, heads=16, ffn=4096, vocab=50272, seq_len=2048, tied_embeddings=True)
    neo = {"model_type": "gpt_neo", "num_layers": 32, "hidden_size": 2560, "num_heads": 20,
           "intermediate_size": None, "max_position_embeddings": 2048, "vocab_size": 50257}
    assert architecture_from_hf_config(neo).ffn == 10240
    assert architecture_from_hf_config(dict(GPT2, model_type=None), seq_len=512).seq_len == 512  # keys alone


def test_hf_missing_key_names_it() -> None:
    config = {k: v for k, v in LLAMA2_7B.items() if k != "hidden_size"}
    with pytest.raises(InputError, match="hidden_size") as err:
        architecture_from_hf_config(config)
    assert err.value.field == "hidden_size" and "add" in err.value.fix


def test_hf_bad_dimensions() -> None:
    with pytest.raises(InputError, match="n_head"):
        architecture_from_hf_config(dict(GPT2, n_head="12"))
    with pytest.raises(InputError, match="multiple"):
        architecture_from_hf_config(dict(GPT2, n_head=7))
    with pytest.raises(InputError, match="model_type"):
        architecture_from_hf_config({"model_type": "mamba", "d_model": 768})



def test_hf_settings_the_model_does_not_price_are_refused_by_name() -> None:
    """Issue 26: an unsupported setting is refused, never priced as something else. A Mixtral
    config (model_type 'mixtral', Llama's keys plus 8 experts) was guessed to be Llama and priced
    dense; experts under a known model type, and a sliding window shorter than the sequence,
    are refused too. A window the sequence fits in, or one switched off (Qwen2), is full attention."""
    mixtral = dict(LLAMA2_7B, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)
    with pytest.raises(InputError, match="'mixtral' is not modelled") as err:
        architecture_from_hf_config(mixtral)
    assert err.value.field == "model_type"
    with pytest.raises(InputError, match="mixture-of-experts") as err:
        architecture_from_hf_config(dict(LLAMA2_7B, model_type="qwen3", num_experts=128, moe_intermediate_size=768))
    assert err.value.field == "num_experts"
    mistral = dict(LLAMA2_7B, model_type="mistral", sliding_window=1024)
    with pytest.raises(InputError, match="sliding-window") as err:
        architecture_from_hf_config(mistral)
    assert err.value.field == "sliding_window" and "--seq-len 1024" in err.value.fix
    assert architecture_from_hf_config(mistral, seq_len=1024).seq_len == 1024
    assert architecture_from_hf_config(dict(LLAMA2_7B, model_type="qwen2", sliding_window=512,
                                            use_sliding_window=False)).seq_len == 4096

def test_load_hf_config(tmp_path: Path) -> None:
    path = tmp_path / "Llama-2-7b-hf" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA2_7B))
    spec = load_hf_config(path)
    assert spec.name == "Llama-2-7b-hf"
    assert spec.architecture == load_workload_file(MODELS_DIR / "llama2-7b.json").architecture


# -- command line -------------------------------------------------------------------------------


def test_cli_hf_writes_a_loadable_file_and_refuses_to_overwrite(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2))
    out = tmp_path / "gpt2.json"
    assert main(["hf", str(config), "--name", "gpt2", "-o", str(out)]) == 0
    first = out.read_text()
    assert load_workload_file(out).architecture.layers == 12

    config.write_text(json.dumps(dict(GPT2, n_layer=24)))
    assert main(["hf", str(config), "--name", "gpt2", "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert out.read_text() == first  # untouched
    assert main(["hf", str(config), "--name", "gpt2", "-o", str(out), "--force"]) == 0
    assert load_workload_file(out).architecture.layers == 24


def test_cli_sailor(tmp_path: Path, capsys) -> None:
    write_sailor_folder(tmp_path / "TOY")
    arch = json.dumps({"layers": 10, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 1000, "seq_len": 128})
    out = tmp_path / "toy.json"
    assert main(["sailor", str(tmp_path / "TOY"), "--name", "toy", "--arch-json", arch, "-o", str(out)]) == 0
    spec = load_workload_file(out)
    assert [p.device_type for p in spec.profiles] == ["GH-96", "V100-16"]
    assert spec.profiles[0].times["2"]["4"][2] == (0.003, 0.006 + 1e-7, 0.5)
    # the architecture disagrees with the profile: a one-line error with the fix, no file written
    wrong = json.dumps({"layers": 9, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 1000, "seq_len": 128})
    other = tmp_path / "other.json"
    assert main(["sailor", str(tmp_path / "TOY"), "--name", "toy", "--arch-json", wrong, "-o", str(other)]) == 2
    assert "--merge-final-norm" in capsys.readouterr().err and not other.exists()
    # profile only (no architecture): allowed, the layer count comes from the profile
    assert main(["sailor", str(tmp_path / "TOY"), "--name", "toy", "-o", str(other)]) == 0
    assert Workload(load_workload_file(other), None, 2).num_layers == 12


def test_sailor_tests_skip_without_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys.modules[__name__], "SAILOR", tmp_path / "absent", raising=True)
    with pytest.raises(pytest.skip.Exception):
        sailor_data()
