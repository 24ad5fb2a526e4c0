"""LoRA adapters through the Python module: the same files and numbers as the CLI."""
import json

import pytest

import quantforge as qf
from conftest import FIXTURE, SOURCE

ADAPTERS = SOURCE / "tests/data/lora-llama"
TEXT = SOURCE / "tests/data/text/adapter_eval.txt"


def test_merge_matches_cli(cli, tmp_path):
    r = qf.merge(FIXTURE, tmp_path / "py", lora=[str(ADAPTERS / "lora"), (ADAPTERS / "dora", 0.7)])
    cli("merge", FIXTURE, "--lora", ADAPTERS / "lora", "--lora", f"{ADAPTERS / 'dora'}:0.7", "-o", tmp_path / "cli")
    assert (tmp_path / "py/model.safetensors").read_bytes() == (tmp_path / "cli/model.safetensors").read_bytes()
    assert r["merged"] == 28 and r["lora"][1]["scale"] == 0.7
    with pytest.raises(qf.UsageError):
        qf.merge(FIXTURE, tmp_path / "none", lora=[])
    assert not (tmp_path / "none").exists()


def test_evaluate_with_an_adapter_matches_cli(cli, tmp_path):
    kw = dict(max_chunks=4, threads=2, progress=False)
    base = qf.evaluate(FIXTURE, TEXT, **kw)
    merged = qf.evaluate(FIXTURE, TEXT, lora=ADAPTERS / "lora", **kw)
    forward = qf.evaluate(FIXTURE, TEXT, lora=ADAPTERS / "lora", lora_mode="forward", **kw)
    cli("eval", FIXTURE, "--text", TEXT, "--max-chunks", "4", "--threads", "2", "--lora", ADAPTERS / "lora",
        "--json", tmp_path / "e.json")
    assert json.loads((tmp_path / "e.json").read_text())["ppl"] == merged["ppl"]
    assert merged["ppl"] < base["ppl"] and abs(forward["ppl"] / merged["ppl"] - 1) < 1e-4
    with pytest.raises(qf.UsageError):
        qf.evaluate(FIXTURE, TEXT, lora=ADAPTERS / "lora", lora_mode="fused", **kw)


def test_convert_lora_matches_cli(cli, tmp_path):
    r = qf.convert_lora(ADAPTERS / "lora", FIXTURE, tmp_path / "py.gguf")
    cli("convert", ADAPTERS / "lora", "--to", "gguf-lora", "--base", FIXTURE, "-o", tmp_path / "cli.gguf")
    assert (tmp_path / "py.gguf").read_bytes() == (tmp_path / "cli.gguf").read_bytes()
    assert r["tensors"] == 56 and r["alpha"] == 16
    with pytest.raises(qf.Unsupported):
        qf.convert_lora(ADAPTERS / "dora", FIXTURE, tmp_path / "d.gguf")
    assert not (tmp_path / "d.gguf").exists()
