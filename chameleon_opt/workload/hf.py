"""A workload from a Hugging Face `config.json`, read as plain JSON (no transformers import), so an
instance can name the exact model a trainer builds with `AutoModelForCausalLM.from_config`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
GPT2_FAMILY = ("gpt2",)


def architecture_from_hf(config: dict[str, Any], path: Path | str | None = None) -> dict[str, Any]:
    """The `architecture` object of a workload for a decoder-only HF config (Llama or GPT-2 family)."""
    kind = config.get("model_type")
    experts = next((k for k in ("num_experts", "num_local_experts", "n_routed_experts") if config.get(k)), None)
    if experts is not None:
        raise InputError(path, experts, f"{config[experts]} experts: a mixture-of-experts model is not modelled",
                         "give a dense model's config")
    try:
        if kind in LLAMA_FAMILY:
            heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
            head_dim = int(config.get("head_dim") or hidden // heads)
            extra = {"head_dim": head_dim} if head_dim * heads != hidden else {}
            return {"layers": int(config["num_hidden_layers"]), "hidden": hidden, **extra,
                    "heads": heads, "kv_heads": int(config.get("num_key_value_heads") or heads),
                    "ffn": int(config["intermediate_size"]), "vocab": int(config["vocab_size"]),
                    "seq_len": int(config.get("max_position_embeddings", 2048)), "gated_mlp": True,
                    "tied_embeddings": bool(config.get("tie_word_embeddings", False)), "learned_positions": False}
        if kind in GPT2_FAMILY:
            hidden = int(config.get("n_embd", 768))
            return {"layers": int(config.get("n_layer", 12)), "hidden": hidden, "heads": int(config.get("n_head", 12)),
                    "ffn": int(config.get("n_inner") or 4 * hidden), "vocab": int(config.get("vocab_size", 50257)),
                    "seq_len": int(config.get("n_positions", 1024)), "gated_mlp": False,
                    "tied_embeddings": bool(config.get("tie_word_embeddings", True)), "learned_positions": True}
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(path, "config.json", f"missing or malformed field ({err})",
                         "give a complete Hugging Face config of a causal LM") from None
    raise InputError(path, "model_type", f"{kind!r} is not a supported family",
                     f"use a Llama-family ({', '.join(LLAMA_FAMILY)}) or GPT-2-family config")


def workload_from_hf(path: Path) -> dict[str, Any]:
    """An inline workload document from a config.json path (or a folder holding one)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise InputError(file, "file", "file not found", "give the path of a Hugging Face config.json") from None
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(file, "file", f"cannot be read ({type(err).__name__})", "give a JSON config.json") from None
    if not isinstance(config, dict):
        raise InputError(file, "<root>", "not a JSON object", "give a Hugging Face config.json")
    name = str(config.get("_name_or_path") or config.get("model_type") or file.parent.name) or "hf-model"
    return {"name": name, "source": f"Hugging Face config {file}", "architecture": architecture_from_hf(config, file)}
