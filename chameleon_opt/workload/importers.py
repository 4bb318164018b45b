"""Importers that turn published model descriptions into workload files (`models/*.json`).

Two sources feed the catalogue:

- Sailor's measured per-layer profiles (`profiles/<MODEL>/<GPU>.json`, Strati et al., SOSP'25,
  github.com/eth-easl/sailor, MIT licence) and its `configs/training_config_*.json` dimensions;
- Hugging Face `config.json` files, for architectures known only by their dimensions.

Both formats are written by other tools and keyed loosely (string keys, family-specific names), so
every importer checks what it reads and raises InputError naming the file, the field and the fix:
a half-read profile or a silently defaulted dimension would give wrong plans without any warning.

Run `python -m chameleon_opt.workload.importers --help` to re-create or extend the catalogue.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chameleon_opt.errors import ChameleonError, InputError
from chameleon_opt.workload.schema import Architecture, Profile, WorkloadSpec

SAILOR_CITATION = ("Sailor (Strati et al., 'Sailor: Automating Distributed Training over Dynamic, "
                   "Heterogeneous, and Geo-distributed Clusters', SOSP'25, arXiv:2504.17096; "
                   "github.com/eth-easl/sailor, ETH Zurich, MIT licence)")

# -- Sailor profiles ----------------------------------------------------------------------------


def _positive_key(key: Any, file: Path, field: str) -> str:
    """A micro-batch size or TP degree key: Sailor writes them as strings of positive integers."""
    if not (isinstance(key, str) and key.isdigit() and int(key) > 0):
        raise InputError(file, field, f"key {key!r} is not a positive integer",
                         'use keys like "1", "2", "4" (micro-batch size, then TP degree)')
    return str(int(key))


def _layer_row(value: Any, file: Path, field: str) -> tuple[float, float, float]:
    """One layer's [forward_s, backward_s, optimizer_update_s]: three finite, non-negative numbers."""
    fix = "give [forward_s, backward_s, optimizer_update_s], three numbers >= 0"
    if not isinstance(value, list) or len(value) != 3:
        raise InputError(file, field, f"expected a list of 3 times, got {value!r:.60}", fix)
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise InputError(file, field, f"time {item!r:.30} is not a number", fix)
        if not math.isfinite(item) or item < 0:
            raise InputError(file, field, f"time {item!r} is not a finite number >= 0", fix)
    return float(value[0]), float(value[1]), float(value[2])


def _merge_last_two(rows: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """Fold a separately profiled final norm (second to last row) into the head (last row).

    Forward and backward times add up, since both run in the same stage one after the other. The
    update column is Sailor's whole-model optimizer step repeated on every row, so it is kept, not
    summed (summing would double count it); where the two rows differ the larger is kept.
    """
    norm, head = rows[-2], rows[-1]
    merged = (norm[0] + head[0], norm[1] + head[1], max(norm[2], head[2]))
    return rows[:-2] + [merged]


def read_sailor_profile(path: Path, device_type: str | None = None, source: str = "",
                        merge_final_norm: bool = False) -> Profile:
    """One Sailor `<GPU>.json` as a Profile, layers ordered by integer index.

    Why the checks: the JSON keys are strings, so a lexical order would put layer "10" before "2"
    and silently scramble the pipeline; missing or duplicate layer indices would shift every later
    layer. Each (micro-batch, TP) entry must list the layers 0..n-1 exactly once.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "file", "file not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "file", f"cannot be read ({type(err).__name__})", "give a readable JSON file") from None
    except json.JSONDecodeError as err:
        raise InputError(path, "file", f"malformed JSON at line {err.lineno}, column {err.colno} ({err.msg})",
                         "fix the JSON syntax") from None
    shape = 'give {"MBS": {"TP": {"0": [fwd, bwd, update], "1": [...], ...}}}'
    if not isinstance(data, dict) or not data:
        raise InputError(path, "<root>", "not a non-empty object of micro-batch sizes", shape)
    times: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    counts: set[int] = set()
    for mbs_key, per_tp in data.items():
        mbs = _positive_key(mbs_key, path, f"[{mbs_key!r}]")
        if not isinstance(per_tp, dict) or not per_tp:
            raise InputError(path, f"[{mbs_key!r}]", "not a non-empty object of TP degrees", shape)
        times[mbs] = {}
        for tp_key, per_layer in per_tp.items():
            tp = _positive_key(tp_key, path, f"[{mbs_key!r}][{tp_key!r}]")
            where = f"[{mbs_key!r}][{tp_key!r}]"
            if not isinstance(per_layer, dict) or not per_layer:
                raise InputError(path, where, "not a non-empty object of layer indices", shape)
            indexed: dict[int, Any] = {}
            for layer_key, row in per_layer.items():
                if not (isinstance(layer_key, str) and layer_key.isdigit()):
                    raise InputError(path, f"{where}[{layer_key!r}]", "layer key is not an integer >= 0",
                                     'number the layers "0" (embedding) to "n-1" (head)')
                index = int(layer_key)
                if index in indexed:
                    raise InputError(path, f"{where}[{layer_key!r}]", f"layer {index} is listed twice",
                                     "keep one entry per layer")
                indexed[index] = row
            if sorted(indexed) != list(range(len(indexed))):
                missing = sorted(set(range(max(indexed) + 1)) - set(indexed))
                raise InputError(path, where, f"layer indices are not 0..{len(indexed) - 1} (missing {missing[:5]})",
                                 "give one entry for every layer from 0 (embedding) to the head")
            rows = [_layer_row(indexed[i], path, f"{where}[{str(i)!r}]") for i in range(len(indexed))]
            if merge_final_norm:
                if len(rows) < 3:
                    raise InputError(path, where, f"{len(rows)} layers, too few to merge the final norm",
                                     "drop --merge-final-norm")
                rows = _merge_last_two(rows)
            counts.add(len(rows))
            times[mbs][tp] = rows
    if len(counts) > 1:
        raise InputError(path, "<root>", f"entries list different layer counts {sorted(counts)}",
                         "every (micro-batch, TP) entry must cover the same layers")
    try:
        return Profile(device_type=device_type or path.stem, source=source, times=times)
    except ValidationError as err:  # the checks above should make this unreachable
        raise InputError(path, "<root>", str(err.errors()[0]["msg"]), shape) from None


def import_sailor_profiles(model_dir: Path, merge_final_norm: bool = False,
                           skip_devices: Sequence[str] = ()) -> list[Profile]:
    """Every `<GPU>.json` of a Sailor profile folder, one Profile per GPU type, sorted by name.

    The device type is the file stem (`GH-96.json` -> "GH-96"), which is how Sailor names GPUs
    and how device types are matched against the cluster. `merge_final_norm` folds a final norm
    profiled as its own row into the head (Sailor's LLAMA-3-8 has 35 rows for 32 blocks), so the
    profile has the schema's blocks + 2 rows. `skip_devices` leaves out files known to be wrong.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(model_dir, "<folder>", "not a folder", "give a Sailor profile folder, e.g. profiles/OPT-350")
    files = sorted(p for p in model_dir.glob("*.json") if p.stem not in set(skip_devices))
    if not files:
        raise InputError(model_dir, "<folder>", "no <GPU>.json profile files",
                         "give a folder holding Sailor profiles such as GH-96.json")
    where = f"{model_dir.parent.name}/{model_dir.name}" if model_dir.parent.name else model_dir.name
    profiles = []
    for path in files:
        source = f"Sailor profile {where}/{path.name}"
        if merge_final_norm:
            source += " (final-norm row merged into the head row)"
        profiles.append(read_sailor_profile(path, source=source, merge_final_norm=merge_final_norm))
    return profiles


# -- architectures ------------------------------------------------------------------------------


def _int_value(config: dict[str, Any], key: str, file: str | Path | None, what: str,
               default: int | None = None) -> int:
    """A required positive integer of a config; `default` is used when the key is absent or null."""
    value = config.get(key)
    if value is None:
        if default is not None:
            return default
        problem = "missing" if key not in config else "is null"
        raise InputError(file, key, problem, f'add "{key}": <{what}> to the config')
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(file, key, f"got {value!r:.40}", f"give {what} as a positive integer")
    return value


def _architecture(fields: dict[str, Any], file: str | Path | None) -> Architecture:
    try:
        return Architecture(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "<config>"
        raise InputError(file, field, str(first["msg"]),
                         "correct the dimensions (hidden a multiple of heads, heads of kv heads)") from None


# Hugging Face `model_type` -> family. The families differ in key names and defaults.
_HF_FAMILIES = {
    "gpt2": "gpt2", "opt": "opt", "gpt_neo": "gpt_neo",
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
}


def _hf_family(config: dict[str, Any], file: str | Path | None) -> str:
    """The key family of a config: its `model_type` (one the catalogue lacks is refused), or, when it
    names none, guessed from family-specific keys."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in _HF_FAMILIES:
        return _HF_FAMILIES[model_type]
    if isinstance(model_type, str):  # a named family the catalogue lacks is never priced as a look-alike
        raise InputError(file, "model_type", f"model type {model_type!r} is not modelled",
                         f"use a config of one of: {', '.join(sorted(_HF_FAMILIES))}, or write the architecture "
                         "by hand")
    if "n_embd" in config or "n_layer" in config:
        return "gpt2"
    if "ffn_dim" in config:
        return "opt"
    if "num_heads" in config and "num_layers" in config:
        return "gpt_neo"
    if "num_hidden_layers" in config or "num_key_value_heads" in config:
        return "llama"
    raise InputError(file, "model_type", f"unsupported or unknown model type {model_type!r}",
                     f"use a config of one of: {', '.join(sorted(_HF_FAMILIES))}, or write the architecture by hand")


_LEARNED_POSITION_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn": "n_inner", "seq_len": "n_positions"},
    "opt": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
            "ffn": "ffn_dim", "seq_len": "max_position_embeddings"},
    "gpt_neo": {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads", "ffn": "intermediate_size",
                "seq_len": "max_position_embeddings"},
}
"""config.json key of each dimension for the GPT-style families (plain MLP, learned positions)."""


def architecture_from_hf_config(config: dict[str, Any], file: str | Path | None = None,
                                seq_len: int | None = None) -> Architecture:
    """The Architecture of a Hugging Face `config.json` (GPT-2, OPT, GPT-Neo, Llama/Mistral/Qwen2/Qwen3).

    Why per family: each family names the same dimensions differently (n_embd, hidden_size), and
    the defaults differ (GPT-2, OPT and GPT-Neo tie the head to the embedding and learn positions;
    Llama-style models use RoPE, a gated MLP and, by default, an untied head). A required key that
    is missing is an error, never a guess. `seq_len` overrides the context length of the config
    (max_position_embeddings is often far longer than the training sequence).
    """
    if not isinstance(config, dict):
        raise InputError(file, "<root>", "not a JSON object", "give a Hugging Face config.json")
    family = _hf_family(config, file)
    tie = config.get("tie_word_embeddings")
    if family in _LEARNED_POSITION_KEYS:
        keys = _LEARNED_POSITION_KEYS[family]
        hidden = _int_value(config, keys["hidden"], file, "the model width")
        fields = dict(
            layers=_int_value(config, keys["layers"], file, "the number of transformer blocks"),
            hidden=hidden, heads=_int_value(config, keys["heads"], file, "the number of attention heads"),
            ffn=_int_value(config, keys["ffn"], file, "the MLP inner size",
                           default=None if family == "opt" else 4 * hidden),
            vocab=_int_value(config, "vocab_size", file, "the vocabulary size"),
            seq_len=_int_value(config, keys["seq_len"], file, "the context length"),
            gated_mlp=False, learned_positions=True, tied_embeddings=True if tie is None else bool(tie))
    else:
        heads = _int_value(config, "num_attention_heads", file, "the number of attention heads")
        hidden = _int_value(config, "hidden_size", file, "the model width")
        head_dim = _int_value(config, "head_dim", file, "the width of one attention head",
                              default=hidden // heads or 1)
        fields = dict(
            layers=_int_value(config, "num_hidden_layers", file, "the number of transformer blocks"),
            hidden=hidden, heads=heads, head_dim=None if head_dim * heads == hidden else head_dim,
            kv_heads=_int_value(config, "num_key_value_heads", file, "the number of KV heads", default=heads),
            ffn=_int_value(config, "intermediate_size", file, "the MLP inner size"),
            vocab=_int_value(config, "vocab_size", file, "the vocabulary size"),
            seq_len=_int_value(config, "max_position_embeddings", file, "the context length"),
            gated_mlp=True, learned_positions=False, tied_embeddings=bool(tie))
    if seq_len is not None:
        fields["seq_len"] = seq_len
    _refuse_unmodelled(config, int(fields["seq_len"]), file)
    return _architecture(fields, file)


MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
"""config.json keys of mixture-of-experts models (Mixtral, Qwen2-MoE / Qwen3-MoE, DeepSeek)."""


def _refuse_unmodelled(config: dict[str, Any], seq_len: int, file: str | Path | None) -> None:
    """Refuse, by name, what the performance model does not price, rather than price a dense,
    full-attention model in its place: experts (their all-to-all, capacity and per-expert weights)
    and sliding-window attention shorter than the training sequence (fewer score FLOPs and a
    smaller KV working set than full attention)."""
    for key in MOE_KEYS:
        value = config.get(key)
        if value not in (None, 0, 1):
            raise InputError(file, key, f"a mixture-of-experts model ({key} = {value!r}) is not modelled",
                             "use a dense model's config")
    window = config.get("sliding_window")
    in_use = config.get("use_sliding_window", True) is not False
    if in_use and isinstance(window, int) and not isinstance(window, bool) and 0 < window < seq_len:
        raise InputError(file, "sliding_window", f"sliding-window attention over {window} tokens, shorter than "
                         f"the {seq_len}-token sequence, is not modelled",
                         f"train with sequences of at most {window} tokens (--seq-len {window})")


def architecture_from_sailor_config(config: dict[str, Any], file: str | Path | None = None) -> Architecture:
    """The Architecture of a Sailor `configs/training_config_*.json`.

    Sailor's configs are GPT-2-type models (`"type": "gpt2"`): an MLP of 4 x hidden, learned
    positions and a head tied to the embedding; the training sequence length is given explicitly.
    """
    if not isinstance(config, dict):
        raise InputError(file, "<root>", "not a JSON object", "give a Sailor training_config_*.json")
    hidden = _int_value(config, "hidden_size", file, "the model width")
    fields = dict(
        layers=_int_value(config, "num_layers", file, "the number of transformer blocks"),
        hidden=hidden, heads=_int_value(config, "heads", file, "the number of attention heads"),
        ffn=4 * hidden, vocab=_int_value(config, "vocab_size", file, "the vocabulary size"),
        seq_len=_int_value(config, "sequence_length", file, "the training sequence length"),
        gated_mlp=False, learned_positions=True, tied_embeddings=True)
    return _architecture(fields, file)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(path, "file", "file not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "file", f"cannot be read ({type(err).__name__})", "give a readable JSON file") from None
    except json.JSONDecodeError as err:
        raise InputError(path, "file", f"malformed JSON at line {err.lineno}, column {err.colno} ({err.msg})",
                         "fix the JSON syntax") from None


def load_hf_config(path: Path | str, name: str | None = None, seq_len: int | None = None,
                   source: str | None = None) -> WorkloadSpec:
    """An architecture-only WorkloadSpec from a Hugging Face `config.json` file.

    The name defaults to the config's `_name_or_path` or the folder name, since HF configs are
    usually saved as `<model>/config.json`.
    """
    path = Path(path)
    config = _read_json(path)
    architecture = architecture_from_hf_config(config, path, seq_len)
    if name is None:
        guessed = config.get("_name_or_path") if isinstance(config, dict) else None
        name = str(guessed).rsplit("/", 1)[-1] if guessed else (path.parent.name or path.stem)
    return WorkloadSpec(name=name, source=source or f"Hugging Face config {path.name} ({path})",
                        architecture=architecture)


# -- writing ------------------------------------------------------------------------------------


def _is_flat_numbers(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)


def _dump(value: Any, indent: int) -> str:
    """JSON indented by one space per level, with lists of numbers kept on one line.

    Why: with plain indentation every per-layer triple takes five lines and a profile of 8
    micro-batch sizes x 3 TP degrees x 50 layers becomes unreadable; one row per layer reads
    like a table and diffs cleanly.
    """
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {_dump(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        if not value or _is_flat_numbers(value):
            return json.dumps(value)
        return "[\n" + ",\n".join(inner + _dump(v, indent + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value)


def workload_json(spec: WorkloadSpec) -> str:
    """The text of a workload file: every architecture flag is written out (a reader should not
    need the schema's defaults to know a model is gated or tied); only absent (null) parts are
    left out."""
    data = spec.model_dump(mode="json", exclude_none=True)
    if not data.get("profiles"):
        data.pop("profiles", None)
    return _dump(data, 0) + "\n"


def write_workload(spec: WorkloadSpec, out: Path, force: bool = False) -> None:
    """Write a workload file; an existing file is kept unless `force`, so no user data is lost."""
    out = Path(out)
    if out.exists() and not force:
        raise InputError(out, "<output>", "file exists", "choose another -o path, or pass --force to overwrite it")
    WorkloadSpec.model_validate_json(workload_json(spec))  # what we write must read back
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(workload_json(spec))


# -- command line -------------------------------------------------------------------------------


def _arch_from_json_arg(text: str) -> Architecture:
    """`--arch-json`: a path to a JSON object, or the object itself (starting with '{')."""
    if text.lstrip().startswith("{"):
        try:
            data, where = json.loads(text), "--arch-json"
        except json.JSONDecodeError as err:
            raise InputError("--arch-json", "<value>", f"malformed JSON ({err.msg})", "fix the JSON") from None
    else:
        data, where = _read_json(Path(text)), text
    if not isinstance(data, dict):
        raise InputError(where, "<root>", "not a JSON object", "give the Architecture fields as an object")
    return _architecture(data, where)


def _sailor_command(args: argparse.Namespace) -> WorkloadSpec:
    profiles = import_sailor_profiles(Path(args.model_dir), args.merge_final_norm, args.skip_device)
    architecture = None
    if args.config and args.arch_json:
        raise InputError("<command line>", "--arch-json", "given together with --config", "give only one of them")
    if args.config:
        architecture = architecture_from_sailor_config(_read_json(Path(args.config)), args.config)
    elif args.arch_json:
        architecture = _arch_from_json_arg(args.arch_json)
    if architecture is not None:
        expected = architecture.layers + 2
        for profile in profiles:
            rows = len(next(iter(next(iter(profile.times.values())).values())))
            if rows != expected:
                hint = " (try --merge-final-norm)" if rows == expected + 1 else ""
                raise InputError(f"{args.model_dir}/{profile.device_type}.json", "<layers>",
                                 f"{rows} profiled layers, the architecture has {architecture.layers} blocks + 2",
                                 f"use a matching architecture, or --skip-device {profile.device_type}{hint}")
    source = args.source or f"{SAILOR_CITATION}: measured per-layer times of {Path(args.model_dir).name}"
    try:
        return WorkloadSpec(name=args.name, source=source, architecture=architecture, profiles=profiles)
    except ValidationError as err:
        raise InputError(args.model_dir, "<profiles>", str(err.errors()[0]["msg"]),
                         "give an architecture (--config or --arch-json) or profiles with layer_bytes") from None


def _hf_command(args: argparse.Namespace) -> WorkloadSpec:
    return load_hf_config(Path(args.config_json), args.name, args.seq_len, args.source)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m chameleon_opt.workload.importers",
        description="Create a workload file (models/NAME.json) from Sailor profiles or a Hugging Face config.")
    commands = parser.add_subparsers(dest="command", required=True)
    sailor = commands.add_parser("sailor", help="import a Sailor profile folder (profiles/<MODEL>)")
    sailor.add_argument("model_dir", help="folder of <GPU>.json profiles")
    sailor.add_argument("--config", help="Sailor configs/training_config_*.json for the architecture")
    sailor.add_argument("--arch-json", help="architecture as a JSON file or inline JSON object")
    sailor.add_argument("--merge-final-norm", action="store_true",
                        help="fold a separately profiled final norm (second to last row) into the head")
    sailor.add_argument("--skip-device", action="append", default=[], metavar="GPU",
                        help="leave out <GPU>.json (repeatable)")
    hf = commands.add_parser("hf", help="import a Hugging Face config.json (architecture only)")
    hf.add_argument("config_json")
    hf.add_argument("--seq-len", type=int, help="training sequence length (default: the config's context length)")
    for sub in (sailor, hf):
        sub.add_argument("--name", required=True, help="workload name")
        sub.add_argument("--source", help="where the numbers come from (default: a citation of the input)")
        sub.add_argument("-o", "--output", required=True, help="output JSON file")
        sub.add_argument("--force", action="store_true", help="overwrite an existing output file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0, or the InputError's 2) and prints one line on error."""
    args = _parser().parse_args(argv)
    try:
        out = Path(args.output)
        if out.exists() and not args.force:  # before any work, so a long import is not wasted
            raise InputError(out, "<output>", "file exists", "choose another -o path, or pass --force to overwrite it")
        spec = _sailor_command(args) if args.command == "sailor" else _hf_command(args)
        write_workload(spec, out, force=args.force)
    except ChameleonError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(f"wrote {out} ({spec.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
