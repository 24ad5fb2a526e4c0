"""quantforge report / qf.report(): hostile inputs and outputs.

The inputs are one real `quantforge eval --baseline --json` run of the fixture
(2 chunks, seconds), variants of it edited here, and quantize output folders
made by hand from it (a quantization_report.json and a weights file to size):
the report only reads those, so no quantization is needed.
"""
import json
import math
import subprocess

import pytest

import quantforge as qf
from quantforge import chart

from conftest import EVAL_TEXT, FIXTURE, cli_path


@pytest.fixture(scope="module")
def eval_json(tmp_path_factory):
    """The dict of a real eval --json run of the fixture against itself."""
    path = tmp_path_factory.mktemp("eval") / "e.json"
    subprocess.run([cli_path(), "-q", "eval", str(FIXTURE), "--text", str(EVAL_TEXT), "--baseline", str(FIXTURE),
                    "--max-chunks", "2", "--json", str(path)], check=True, capture_output=True)
    return json.loads(path.read_text())


def report_cli(*args):
    return subprocess.run([cli_path(), "-q", "report", *map(str, args)], capture_output=True, text=True)


def one_line_error(r, code, *fragments):
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.startswith("quantforge: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


def write_eval(path, ev, model=None, **changes):
    """ev with `model` (a file created with that many bytes when an int is given) and other keys changed."""
    d = dict(ev)
    if model is not None:
        d["model"] = str(model)
    d.update(changes)
    path.write_text(json.dumps(d))
    return path


def fake_model(path, size):
    path.write_bytes(b"\0" * size)
    return path


def quantize_output(folder, ev, size=2048):
    """A quantize output folder as report reads it: its report with the evaluation, and weights to size."""
    folder.mkdir()
    fake_model(folder / "model.safetensors", size)
    rep = {"method": "rtn", "linears": [{"name": "model.layers.0.mlp.up_proj", "weights": "int8"}],
           "evaluation": dict(ev, model=str(folder))}
    (folder / "quantization_report.json").write_text(json.dumps(rep))
    return folder


def no_nan(text):
    def refuse(c):
        raise AssertionError(f"{c} in report.json")

    return json.loads(text, parse_constant=refuse)


# ---- outputs ----------------------------------------------------------------


def test_output_never_replaces_an_input(eval_json, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    e = write_eval(out / "report.json", eval_json, fake_model(tmp_path / "m.gguf", 1000))
    before = e.read_bytes()
    one_line_error(report_cli(e, "-o", out, "--force"), 5, "would overwrite an input")
    with pytest.raises(qf.IoError, match="would overwrite an input"):
        chart.render([e], out, force=True)
    assert e.read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["report.json"]


def test_output_never_inside_a_checkpoint(eval_json, tmp_path):
    q = quantize_output(tmp_path / "q", eval_json)
    before = sorted(p.name for p in q.iterdir())
    one_line_error(report_cli(q, "-o", q), 5, "would overwrite an input")
    one_line_error(report_cli(q, "-o", q / "charts", "--force"), 5, "lies inside an input")
    # the model folder the evaluation names (the reference here) is an input too
    one_line_error(report_cli(q, "-o", FIXTURE / "report"), 5, "lies inside an input")
    with pytest.raises(qf.IoError, match="lies inside an input"):
        qf.report([q], q / "charts")
    assert sorted(p.name for p in q.iterdir()) == before
    assert not (FIXTURE / "report").exists()


def test_existing_report_needs_force(eval_json, tmp_path):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed (scripts/setup.sh installs it)")
    a = write_eval(tmp_path / "a.json", eval_json, fake_model(tmp_path / "a.gguf", 1000))
    b = quantize_output(tmp_path / "q", eval_json)
    out = tmp_path / "out"
    rows = chart.render([a, b], out)
    assert [r["name"] for r in rows] == ["fixture-llama (reference)", "a.gguf", "q"]
    assert [r["tokens"] for r in rows[1:]] == [eval_json["tokens_scored"]] * 2
    first = no_nan((out / "report.json").read_text())
    one_line_error(report_cli(a, b, "-o", out), 5, "already exists", "--force")
    with pytest.raises(qf.IoError, match="already exists"):
        qf.report([a, b], out)
    r = report_cli(a, b, "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    assert no_nan((out / "report.json").read_text()) == first
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporaries left
    chart.render([a, b], out, force=True)


# ---- inputs -----------------------------------------------------------------


@pytest.mark.parametrize("name,text,fragment", [
    ("garbage", "this is not json", "not valid JSON"),
    ("truncated", '{"model": "m", "ppl": ', "not valid JSON"),
    ("list", "[1, 2, 3]", "not an object"),
])
def test_not_json_is_one_line(tmp_path, name, text, fragment):
    bad = tmp_path / f"{name}.json"
    bad.write_text(text)
    one_line_error(report_cli(bad, "-o", tmp_path / "out"), 3, str(bad), fragment)
    with pytest.raises(qf.InvalidInput, match=fragment):
        qf.report([bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("changes,fragment", [
    ({"ppl": "high"}, '"ppl" must be a finite positive number, got "high"'),
    ({"ppl": math.nan}, "NaN and Infinity are not JSON numbers"),
    ({"ppl": math.inf}, "NaN and Infinity are not JSON numbers"),
    ({"kld": {"mean": "low"}}, '"kld.mean" must be a finite number >= 0'),
    ({"tokens_scored": 2.5}, '"tokens_scored" must be a positive whole number'),
    ({"valid": "true"}, '"valid" must be true or false'),
    ({"baseline": None}, "no baseline comparison"),
    ({"top1_agreement": 2}, '"top1_agreement" must be a fraction between 0 and 1'),
])
def test_bad_values_are_one_line(eval_json, tmp_path, changes, fragment):
    bad = write_eval(tmp_path / "bad.json", eval_json, fake_model(tmp_path / "m.gguf", 1000), **changes)
    one_line_error(report_cli(bad, "-o", tmp_path / "out"), 3, fragment)
    with pytest.raises(qf.InvalidInput, match="^" + str(bad).replace(".", r"\.")):
        qf.report([bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_quantize_report_is_one_line(eval_json, tmp_path):
    q = quantize_output(tmp_path / "q", eval_json)
    rep = json.loads((q / "quantization_report.json").read_text())
    rep["evaluation"]["ppl"] = math.nan  # json.dumps writes NaN
    (q / "quantization_report.json").write_text(json.dumps(rep))
    one_line_error(report_cli(q, "-o", tmp_path / "out"), 3, "quantization_report.json", "NaN")


def test_missing_path_is_not_found(eval_json, tmp_path):
    one_line_error(report_cli(tmp_path / "nope.json", "-o", tmp_path / "out"), 6, "nope.json: no such file or folder")
    with pytest.raises(qf.NotFound):
        qf.report([tmp_path / "nope"], tmp_path / "out")
    # the model an eval JSON names is sized, so it is read too
    e = write_eval(tmp_path / "e.json", eval_json, tmp_path / "gone.gguf")
    one_line_error(report_cli(e, "-o", tmp_path / "out"), 6, "gone.gguf: no such model file or folder")


def test_different_token_counts_are_refused(eval_json, tmp_path):
    n = eval_json["tokens_scored"]
    a = write_eval(tmp_path / "a.json", eval_json, fake_model(tmp_path / "a.gguf", 1000))
    b = write_eval(tmp_path / "b.json", eval_json, fake_model(tmp_path / "b.gguf", 2000), tokens_scored=2 * n)
    one_line_error(report_cli(a, b, "-o", tmp_path / "out"), 3, "not comparable", f"{a} {n}", f"{b} {2 * n}")
    with pytest.raises(qf.InvalidInput, match="not comparable"):
        qf.report([a, b], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_kv_sweep_is_charted_by_kv_bytes_per_token(eval_json, tmp_path):
    """qf.kv_sweep's dict, saved as JSON, charts on its own: one point per cache format at its
    bytes per token, the f16 cache as the reference; mixed with other inputs it is refused."""
    sweep = qf.kv_sweep(FIXTURE, EVAL_TEXT, ctx=256, max_chunks=1, types=["f16", "q8_0", "q4_0", "kivi2"],
                        decode_tokens=0, max_kld=1.0, progress=False)
    assert [r["kv_dtype"] for r in sweep["rows"]] == ["f16", "q8_0", "q4_0", "kivi2"]
    assert sweep["best"] == "kivi2"  # the smallest, and a bound of 1.0 admits everything
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    rows = chart.render([path], tmp_path / "out")
    assert rows[0]["name"] == "f16 cache (reference)" and rows[0]["bytes"] == sweep["f16_bytes_per_token"]
    assert all(r["unit"] == "kv_cache" for r in rows)
    assert [r["bytes"] for r in rows[1:]] == sorted(r["kv_bytes_per_token"] for r in sweep["rows"])
    assert (tmp_path / "out" / "chart.png").stat().st_size > 0
    other = tmp_path / "e.json"
    other.write_text(json.dumps(eval_json))
    with pytest.raises(qf.UsageError, match="charted on its own"):
        chart.render([path, other], tmp_path / "out2")
    with pytest.raises(qf.UsageError, match="unknown KV-cache type"):
        qf.kv_sweep(FIXTURE, EVAL_TEXT, types=["q3"], progress=False)
