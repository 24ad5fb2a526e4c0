"""Hostile or unusual argument values: each is taken as documented or refused with a qf error naming it."""
import math
import os

import pytest

import quantforge as qf
from conftest import CALIB_TEXT, EVAL_TEXT, FIXTURE, RECIPES

W4 = {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"scheme": "W4A16", "targets": ["Linear"],
                                                                    "ignore": ["lm_head"]}}}}


@pytest.mark.parametrize("bounds", [
    {"max_kld": math.nan}, {"max_kld": math.inf}, {"max_kld": -0.5},
    {"max_ppl_ratio": math.nan}, {"max_ppl_ratio": -1.0}, {"max_ppl_ratio": 0.0}, {"max_ppl_ratio": math.inf},
    {"max_ppl_delta": math.nan}, {"max_ppl_delta": -math.inf},
])
def test_evaluate_refuses_gate_bounds_that_cannot_gate(bounds):
    # NaN compares false with everything: as a bound it would pass any model.
    with pytest.raises(qf.UsageError) as e:
        qf.evaluate(FIXTURE, EVAL_TEXT, baseline=FIXTURE, max_chunks=1, progress=False, **bounds)
    name = next(iter(bounds))
    assert str(e.value).startswith(f"{name}: must be a finite number"), str(e.value)


def test_evaluate_gate_bounds_in_range_still_gate():
    r = qf.evaluate(FIXTURE, EVAL_TEXT, baseline=FIXTURE, max_chunks=1, progress=False,
                    max_ppl_delta=-1.0, max_kld=0.0)  # the same model cannot improve by 1
    assert not r["gate"]["passed"] and r["gate"]["failures"]


def test_cli_and_module_refuse_a_bound_with_the_same_words(cli):
    p = cli("eval", FIXTURE, "--text", EVAL_TEXT, "--baseline", FIXTURE, "--max-ppl-ratio", "-1", check=False)
    assert p.returncode == 2 and "--max-ppl-ratio: must be a finite number > 0, got '-1'" in p.stderr, p.stderr
    with pytest.raises(qf.UsageError, match=r"^max_ppl_ratio: must be a finite number > 0, got '-1'$"):
        qf.evaluate(FIXTURE, EVAL_TEXT, baseline=FIXTURE, max_ppl_ratio=-1.0, progress=False)


def test_bytes_paths_are_file_system_paths(tmp_path):
    want = qf.inspect(FIXTURE)
    assert qf.inspect(os.fsencode(str(FIXTURE))) == want
    # a name that is not UTF-8: as bytes, and as the str os.listdir gives for it
    odd = tmp_path / os.fsdecode(b"fixture-\xff")
    odd.symlink_to(FIXTURE, target_is_directory=True)
    assert qf.inspect(os.fsencode(odd))["parameters"] == want["parameters"]
    assert qf.inspect(odd)["parameters"] == want["parameters"]
    assert qf.Tokenizer(os.fsencode(odd)).encode("hi") == qf.Tokenizer(FIXTURE).encode("hi")
    m = qf.Model(os.fsencode(str(FIXTURE)))
    assert m.source == qf.Model(FIXTURE).source
    r = qf.evaluate(os.fsencode(odd), os.fsencode(str(EVAL_TEXT)), max_chunks=1, progress=False)
    assert r["ppl"] == qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=1, progress=False)["ppl"]


def test_a_str_path_that_names_no_bytes_is_a_usage_error():
    with pytest.raises(qf.UsageError, match=r"^model: not a valid file name"):
        qf.inspect("fixture-\ud800")  # a lone surrogate that surrogateescape cannot map back to a byte
    with pytest.raises(TypeError):
        qf.inspect(42)


def test_quantize_takes_bytes_paths(tmp_path):
    out = tmp_path / "b"
    r = qf.quantize(os.fsencode(str(FIXTURE)), os.fsencode(str(RECIPES / "w4-rtn.yaml")), os.fsencode(str(out)),
                    calib=os.fsencode(str(CALIB_TEXT)), threads=2, progress=False)
    assert r.path == str(out) and (out / "model.safetensors").exists()
    assert "b'/" not in r.report["invocation"], r.report["invocation"]  # paths as str, not bytes reprs


@pytest.mark.parametrize("calib", [{"a": "b"}, {"one sample", "another"}, frozenset({"x"}), {"a": 1}.keys()])
def test_quantize_refuses_unordered_calib(tmp_path, calib):
    with pytest.raises(qf.UsageError, match=r"^calib: a \w+ is not a list of samples"):
        qf.quantize(FIXTURE, W4, tmp_path / "o", calib=calib, progress=False)
    assert not (tmp_path / "o").exists()


def test_calib_sample_with_a_lone_surrogate_names_the_sample(tmp_path):
    with pytest.raises(qf.InvalidInput) as e:
        qf.quantize(FIXTURE, W4, tmp_path / "o", calib=["ok", "bad \udcff"], progress=False)
    msg = str(e.value)
    assert msg.startswith("calib[1]: ") and "surrogate" in msg, msg
    assert "calibration.jsonl" not in msg and "quantforge-" not in msg, msg  # no temporary file


def nested(depth):
    d = {"x": 1}
    for _ in range(depth - 1):
        d = {"x": d}
    return d


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deeply_nested_recipe_dict_is_a_usage_error(tmp_path, depth):
    with pytest.raises(qf.UsageError, match=r"^recipe: the dict nests deeper than"):
        qf.quantize(FIXTURE, {"quant_stage": nested(depth)}, tmp_path / "o", progress=False)
    cyclic = {}
    cyclic["quant_stage"] = cyclic
    with pytest.raises(qf.UsageError, match=r"^recipe: the dict nests deeper than"):
        qf.quantize(FIXTURE, cyclic, tmp_path / "o", progress=False)


def test_recipe_dict_just_within_the_depth_is_parsed(tmp_path):
    # 64 levels pass the module's check and reach the recipe parser, which names the unknown key
    with pytest.raises(qf.InvalidInput, match="x"):
        qf.quantize(FIXTURE, {"quant_stage": nested(63)}, tmp_path / "o", progress=False)
