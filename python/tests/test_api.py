"""The Python module against the CLI and the files themselves, on the fixture model."""
import json
import os
import signal
import struct
import threading
import time

import numpy as np
import pytest

import quantforge as qf
from conftest import CALIB_TEXT, EVAL_TEXT, FIXTURE, RECIPES

W4_RTN = {
    "quant_stage": {"quant_modifiers": {"QuantizationModifier": {
        "targets": ["Linear"], "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}}}}}},
    "calibration": {"num_samples": 16, "seq_len": 256, "seed": 0},
    "export": {"format": "compressed-tensors"},
}


def read_safetensors(path):
    """name -> (dtype, shape, bytes), straight from the file's header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def test_inspect_matches_cli(cli):
    want = json.loads(cli("inspect", FIXTURE, "--json").stdout)
    assert qf.inspect(FIXTURE) == want
    assert qf.inspect(str(FIXTURE))["architecture"] == want["architecture"]


def test_evaluate_matches_cli(cli, tmp_path):
    out = tmp_path / "eval.json"
    cli("eval", FIXTURE, "--text", EVAL_TEXT, "--max-chunks", "2", "--threads", "2", "--json", out)
    want = json.loads(out.read_text())
    got = qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=2, threads=2, progress=False)
    for k in ("ppl", "nll", "tokens_scored", "spans", "ctx", "mode", "valid"):
        assert got[k] == want[k], k
    assert got["valid"] and got["ppl"] > 1


def test_evaluate_gate_is_reported_not_raised():
    r = qf.evaluate(FIXTURE, EVAL_TEXT, baseline=FIXTURE, max_chunks=1, max_kld=-0.0 + 1e-12, progress=False)
    assert r["kld"]["mean"] == 0 and r["gate"]["passed"]
    r = qf.evaluate(FIXTURE, EVAL_TEXT, baseline=FIXTURE, max_chunks=1, max_ppl_ratio=0.5, progress=False)
    assert not r["gate"]["passed"] and r["gate"]["failures"]


def test_tensor_views_are_the_mapped_bytes(cli):
    m = qf.Model(FIXTURE)
    raw = read_safetensors(FIXTURE / "model.safetensors")
    assert sorted(m.tensor_names()) == sorted(raw)
    inspected = qf.inspect(FIXTURE)
    assert inspected["parameters"] == sum(int(np.prod(s)) for _, s, _ in raw.values())
    for name, (dtype, shape, data) in raw.items():
        t = m.tensor(name)
        assert list(t.shape) == shape, name
        assert not t.flags.writeable and not t.flags.owndata, name  # a view, read-only
        assert t.tobytes() == data, name
        assert {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}[dtype] == t.dtype, name
        d = m.tensor(name, dequantize=True)
        assert d.dtype == np.float32 and np.array_equal(d, t.astype(np.float32)), name
    with pytest.raises(ValueError):
        m.tensor(raw and next(iter(raw)))[0] = 0  # read-only
    with pytest.raises(qf.NotFound):
        m.tensor("no.such.tensor")


def test_tokenizer_logits_and_generate():
    tok = qf.Tokenizer(FIXTURE)
    ids = tok.encode("Once upon a time")
    assert ids[0] == 1 and tok.decode(ids) == "Once upon a time"
    m = qf.Model(FIXTURE)
    assert m.config["model_type"] == "llama"
    logits = m.logits(ids)
    assert logits.shape == (len(ids), m.config["vocab_size"]) and np.isfinite(logits).all()
    g = m.generate("Once upon a time", n=6)
    assert g["prompt_tokens"] == ids and len(g["tokens"]) == 6
    # greedy: the first new token is the argmax of the prompt's last logits
    assert g["tokens"][0] == int(np.argmax(logits[-1]))
    assert g["text"].startswith("Once upon a time") and g["text"].endswith(g["completion"])
    # a longer prefix's logits agree with the shorter run on the shared positions
    longer = m.logits(ids + g["tokens"][:2])
    assert np.allclose(longer[: len(ids)], logits, rtol=0, atol=1e-4)
    with pytest.raises(qf.InvalidInput):
        m.logits([10**6])
    with pytest.raises(qf.InvalidInput):
        tok.decode([-1])


def test_convert_is_byte_identical_to_cli(cli, tmp_path):
    a, b = tmp_path / "py.gguf", tmp_path / "cli.gguf"
    r = qf.convert(FIXTURE, a, type="Q8_0", threads=2, progress=False)
    cli("convert", FIXTURE, "--to", "gguf", "--type", "Q8_0", "--threads", "2", "-o", b)
    assert a.read_bytes() == b.read_bytes()
    assert r["path"] == str(a) and r["output_bytes"] == a.stat().st_size and 8 < r["bits_per_weight"] < 9.5
    g = qf.Model(a)
    q = g.tensor("blk.0.attn_q.weight", dequantize=True)
    with pytest.raises(qf.Unsupported):
        g.tensor("blk.0.attn_q.weight")  # quantized: no raw view
    assert q.dtype == np.float32 and q.shape == qf.Model(FIXTURE).tensor("model.layers.0.self_attn.q_proj.weight").shape
    o = qf.convert(FIXTURE, tmp_path / "ov.gguf", type="Q4_K_M", output_tensor_type="f16",
                   token_embedding_type="q8_0", progress=False)
    assert o["tensor_types"]["output.weight"] == "f16" and o["tensor_types"]["token_embd.weight"] == "q8_0", o
    with pytest.raises(qf.UsageError):
        qf.convert(FIXTURE, tmp_path / "bad.gguf", type="Q4_K_M", output_tensor_type="q4_K_M", progress=False)
    with pytest.raises(qf.IoError):
        qf.convert(FIXTURE, a, type="Q8_0", progress=False)  # exists: refused without force
    with pytest.raises(qf.IoError):
        qf.convert(FIXTURE, FIXTURE / "model.safetensors", type="Q8_0", force=True, progress=False)  # an input
    with pytest.raises(qf.UsageError):
        qf.convert(FIXTURE, tmp_path / "z.gguf", type="Q9_K", progress=False)


def test_convert_to_a_size_budget_matches_cli(cli, tmp_path):
    im = tmp_path / "im.gguf"
    qf.imatrix(FIXTURE, CALIB_TEXT, im, chunks=4, progress=False)
    kw = dict(imatrix=im, calib=CALIB_TEXT, probe_spans=1, threads=2, progress=False)
    plan = qf.convert(FIXTURE, tmp_path / "dry.gguf", target_bpw=4.6, dry_run=True, **kw)["plan"]
    assert not (tmp_path / "dry.gguf").exists() and plan["bytes"] <= plan["budget_bytes"], plan["bytes"]
    assert plan["predicted_kld"] <= plan["lagrangian"]["predicted_kld"] and plan["presets"], plan["lagrangian"]
    a, b = tmp_path / "py.gguf", tmp_path / "cli.gguf"
    r = qf.convert(FIXTURE, a, target_bpw=4.6, **kw)
    cli("convert", FIXTURE, "--to", "gguf", "--target-bpw", "4.6", "--imatrix", im, "--calib", CALIB_TEXT,
        "--probe-spans", "1", "--threads", "2", "-o", b)
    assert a.read_bytes() == b.read_bytes()
    assert r["plan_path"] == str(tmp_path / "py.mix.json") and r["plan"]["bits_per_weight"] <= 4.6
    assert {t["name"]: t["type"] for t in r["plan"]["tensors"]} == r["tensor_types"]
    again = qf.convert(FIXTURE, tmp_path / "re.gguf", target_size="2700000", sensitivity=tmp_path / "py.mix.json",
                       progress=False)
    assert again["plan"]["bytes"] <= 2700000 and again["plan"]["seconds"]["probes"] == 0
    with pytest.raises(qf.UsageError):
        qf.convert(FIXTURE, tmp_path / "x.gguf", type="Q4_K_M", target_bpw=4.6, **kw)
    with pytest.raises(qf.UsageError):
        qf.convert(FIXTURE, tmp_path / "x.gguf", type="Q4_K_M", calib=CALIB_TEXT, progress=False)
    with pytest.raises(qf.InvalidInput):
        qf.convert(FIXTURE, tmp_path / "x.gguf", target_bpw=2, **kw)
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.mix.json").exists()


def test_imatrix_matches_cli(cli, tmp_path):
    a, b = tmp_path / "py.gguf", tmp_path / "cli.gguf"
    r = qf.imatrix(FIXTURE, CALIB_TEXT, a, ctx=128, chunks=2, threads=2, progress=False)
    cli("imatrix", FIXTURE, "--text", CALIB_TEXT, "--ctx", "128", "--chunks", "2", "--threads", "2", "-o", b)
    assert a.read_bytes() == b.read_bytes() and r["chunks"] == 2


def test_quantize_dict_recipe_and_list_calib(cli, tmp_path):
    samples = [line for line in CALIB_TEXT.read_text().splitlines() if line.strip()][:32]
    out = tmp_path / "w4"
    r = qf.quantize(FIXTURE, W4_RTN, out, calib=samples, threads=2, progress=False, eval_text=EVAL_TEXT,
                    eval_max_chunks=2)
    assert isinstance(r, qf.QuantizeResult)
    assert r.path == str(out) and r.format == "compressed-tensors" and r.linears == 7 * r.layers
    assert len(r.per_layer) == r.layers and all(0 < l["mean_error"] < 0.5 for l in r.per_layer)
    assert r.evaluation["valid"] and r.evaluation["ppl"] > r.evaluation["baseline"]["ppl"] * 0.9
    # the same recipe as a YAML file through the CLI: the same weights
    cli("quantize", FIXTURE, "--recipe", RECIPES / "w4-rtn.yaml", "--threads", "2", "-o", tmp_path / "cli",
        "--calib", CALIB_TEXT)
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "cli/model.safetensors").read_bytes()
    assert qf.inspect(out)["quantization_config"]["quant_method"] == "compressed-tensors"
    assert r.report == json.loads((out / "quantization_report.json").read_text())
    assert r.report["invocation"].startswith("quantforge.quantize(") and r.report["evaluation"] == r.evaluation


def test_quantize_list_calib_is_kept_and_reproducible(tmp_path):
    samples = [line for line in CALIB_TEXT.read_text().splitlines() if line.strip()][:40]
    recipe = (RECIPES / "w4-gptq.yaml").read_text()  # a YAML string; its relative dataset is overridden
    a = qf.quantize(FIXTURE, recipe, tmp_path / "a", calib=samples, threads=2, progress=False)
    assert (tmp_path / "a/calibration.jsonl").exists()
    assert a.report["calibration"]["dataset"] == "calibration.jsonl"
    # the copied recipe alone (its dataset relative to it, inside the output) gives the same weights
    b = qf.quantize(FIXTURE, tmp_path / "a/recipe.yaml", tmp_path / "b", threads=2, progress=False)
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()
    assert b.report["calibration"]["tokens"] == a.report["calibration"]["tokens"] > 0


def test_quantize_on_the_device_host_build(tmp_path):
    samples = [line for line in CALIB_TEXT.read_text().splitlines() if line.strip()][:24]
    # RTN needs no calibration forward: the same bytes as the CPU.
    rtn = (RECIPES / "w4-rtn.yaml").read_text()
    qf.quantize(FIXTURE, rtn, tmp_path / "rcpu", threads=2, progress=False)
    qf.quantize(FIXTURE, rtn, tmp_path / "rhost", threads=2, progress=False, device="host")
    assert (tmp_path / "rcpu/model.safetensors").read_bytes() == (tmp_path / "rhost/model.safetensors").read_bytes()
    # GPTQ's layers run on the device's forward: a checkpoint as good as the CPU's.
    recipe = (RECIPES / "w4-gptq.yaml").read_text()
    a = qf.quantize(FIXTURE, recipe, tmp_path / "cpu", calib=samples, threads=2, progress=False)
    b = qf.quantize(FIXTURE, recipe, tmp_path / "host", calib=samples, threads=2, progress=False, device="host")
    assert a.report["device"] == "cpu" and b.report["device"] == "host"
    assert "device='host'" in b.report["invocation"]
    ea = qf.evaluate(tmp_path / "cpu", EVAL_TEXT, baseline=FIXTURE, max_chunks=4, threads=2, progress=False)
    eb = qf.evaluate(tmp_path / "host", EVAL_TEXT, baseline=FIXTURE, max_chunks=4, threads=2, progress=False,
                     device="host")
    assert ea["device"] == "cpu" and eb["device"] == "host" and eb["device_bytes"] > 0
    assert ea["kld"]["mean"] > 0 and abs(eb["kld"]["mean"] - ea["kld"]["mean"]) <= 0.05 * ea["kld"]["mean"]
    bench = qf.bench(FIXTURE, prompt=16, gen=2, threads=2, device="host")
    assert bench["device"] == "host" and bench["decode_tokens_per_s"] > 0
    im = qf.imatrix(FIXTURE, CALIB_TEXT, tmp_path / "i.gguf", ctx=128, chunks=1, threads=2, progress=False,
                    device="host")
    assert im["entries"] > 0
    with pytest.raises(qf.UsageError):
        qf.quantize(FIXTURE, recipe, tmp_path / "x", calib=samples, progress=False, device="gpu")
    assert not (tmp_path / "x").exists()
    with pytest.raises(qf.Unsupported):
        qf.bench(FIXTURE, prompt=8, gen=1, batch=2, device="host")


def test_errors_are_typed(tmp_path):
    with pytest.raises(qf.NotFound) as e:
        qf.inspect(tmp_path / "missing")
    assert isinstance(e.value, qf.Error) and "missing" in str(e.value)
    bad = {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"scheme": "W4A16", "targetz": ["Linear"]}}}}
    with pytest.raises(qf.InvalidInput) as e:
        qf.quantize(FIXTURE, bad, tmp_path / "o", progress=False)
    assert "targetz" in str(e.value) and isinstance(e.value, ValueError)
    assert not (tmp_path / "o").exists()
    with pytest.raises(qf.Unsupported):
        qf.quantize(FIXTURE, "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A4\n",
                    tmp_path / "o", progress=False)
    with pytest.raises(qf.UsageError):
        qf.evaluate(FIXTURE, EVAL_TEXT, threads=-3, progress=False)
    with pytest.raises(qf.UsageError):
        qf.evaluate(FIXTURE, EVAL_TEXT, max_kld=0.1, progress=False)  # a gate needs a baseline
    with pytest.raises(qf.NotFound):
        qf.quantize(FIXTURE, "no-such-recipe.yaml", tmp_path / "o", progress=False)


class _InterruptingBar:
    """A progress bar that presses Ctrl-C (SIGINT to this process) at its first update."""

    def __init__(self, *args):
        pass

    def update_to(self, done):
        os.kill(os.getpid(), signal.SIGINT)

    def close(self):
        pass


def test_ctrl_c_stops_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("quantforge._progress.make_bar", _InterruptingBar)
    out = tmp_path / "w4"
    with pytest.raises(KeyboardInterrupt):
        qf.quantize(FIXTURE, RECIPES / "w4-gptq.yaml", out, threads=2)
    assert list(tmp_path.iterdir()) == []  # no output, no staging folder, no spill
    gguf = tmp_path / "x.gguf"
    with pytest.raises(KeyboardInterrupt):
        qf.convert(FIXTURE, gguf, type="Q4_K_M")
    assert list(tmp_path.iterdir()) == []
    # and the module still works afterwards
    assert qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=1, progress=False)["valid"]


def test_long_calls_release_the_gil(tmp_path):
    done = threading.Event()
    result = {}

    def work():
        result["r"] = qf.quantize(FIXTURE, RECIPES / "w4-gptq.yaml", tmp_path / "q", threads=1, progress=False)
        done.set()

    t = threading.Thread(target=work)
    ticks = 0
    start = time.monotonic()
    t.start()
    while not done.is_set():
        ticks += 1  # runs only while the quantize thread has let go of the GIL
        time.sleep(0.001)
    t.join()
    elapsed = time.monotonic() - start
    assert result["r"].linears > 0
    assert elapsed > 0.05, "quantize finished too fast to tell"
    # held GIL: the loop could not run at all (a tick or two); released: about 900 ticks/s,
    # so 50/s leaves room for a loaded machine
    assert ticks > 0.1 * elapsed / 0.002, (ticks, elapsed)


def test_progress_bars(capfd, monkeypatch):
    import quantforge._progress as p

    monkeypatch.setattr(p, "_tqdm", None)  # the plain fallback
    qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=2, progress=True)
    err = capfd.readouterr().err
    assert "eval: 2/2 spans" in err and err.rstrip().endswith("done")
    qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=2, progress=False)
    assert capfd.readouterr().err == ""


def test_stub_lists_the_api():
    stub = open(os.path.join(os.path.dirname(qf.__file__), "__init__.pyi")).read()
    for name in qf.__all__:
        assert f" {name}" in stub or f"\n{name}" in stub, name
    assert qf.__version__


def test_report_chart(cli, tmp_path):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed (scripts/setup.sh installs it)")
    a = qf.quantize(FIXTURE, RECIPES / "w8-rtn.yaml", tmp_path / "w8", threads=2, progress=False, eval_text=EVAL_TEXT,
                   eval_max_chunks=2)
    g = tmp_path / "m.gguf"
    qf.convert(FIXTURE, g, type="Q4_K_M", progress=False)
    (tmp_path / "g.json").write_text(json.dumps(qf.evaluate(g, EVAL_TEXT, baseline=FIXTURE, max_chunks=2, progress=False)))
    rows = qf.report([tmp_path / "w8", tmp_path / "g.json"], tmp_path / "chart")
    assert [r["name"] for r in rows] == ["fixture-llama (reference)", "m.gguf", "w8"]
    assert rows[2]["ppl"] == a.evaluation["ppl"] and rows[0]["ppl"] == a.evaluation["baseline"]["ppl"]
    assert rows[1]["bytes"] == g.stat().st_size
    assert (tmp_path / "chart/chart.png").read_bytes()[:4] == b"\x89PNG"
    assert "m.gguf" in (tmp_path / "chart/index.html").read_text()
    # the CLI draws the same from the same inputs
    cli("report", tmp_path / "w8", tmp_path / "g.json", "-o", tmp_path / "cli")
    assert json.loads((tmp_path / "cli/report.json").read_text()) == json.loads((tmp_path / "chart/report.json").read_text())
    # refused: an output without an evaluation; mixed references
    qf.quantize(FIXTURE, RECIPES / "w8-rtn.yaml", tmp_path / "noeval", threads=2, progress=False)
    with pytest.raises(qf.InvalidInput, match="no evaluation"):
        qf.report([tmp_path / "noeval"], tmp_path / "x")
    r = cli("report", tmp_path / "noeval", "-o", tmp_path / "x", check=False)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "no evaluation" in r.stderr


def test_bench_has_the_cli_keys(cli, tmp_path):
    out = tmp_path / "b.json"
    cli("bench", FIXTURE, "-p", "16", "-n", "4", "--threads", "2", "--json", out)
    want = json.loads(out.read_text())
    got = qf.bench(FIXTURE, prompt=16, gen=4, threads=2)
    assert list(got) == list(want)
    for k in ("model", "weight_format", "parameters", "prompt", "gen", "batch", "kv_dtype", "threads", "kv_bytes_per_token"):
        assert got[k] == want[k], k
    assert got["prefill_tokens_per_s"] > 0 and got["decode_tokens_per_s"] > 0
    with pytest.raises(qf.UsageError):
        qf.bench(FIXTURE, prompt=0)


def test_quantize_resume_after_kill(tmp_path):
    """A quantize killed with SIGKILL after its first layers goes on with resume=True (samples given as a
    list, so the state must be matched by the data, not by the temporary file's path) and writes the same
    weights as an uninterrupted run."""
    import subprocess
    import sys
    samples = [line for line in CALIB_TEXT.read_text().splitlines() if line.strip()][:40]
    recipe = (RECIPES / "w4-gptq.yaml").read_text()
    ref = qf.quantize(FIXTURE, recipe, tmp_path / "ref", calib=samples, threads=1, progress=False)
    out = tmp_path / "out"
    code = ("import sys, quantforge as qf\n"
            f"qf.quantize({str(FIXTURE)!r}, {recipe!r}, {str(out)!r}, calib={samples!r}, threads=1, progress=False)\n")
    p = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    state = tmp_path / ".out.resume/state.json"

    def two_layers_saved():
        try:
            return json.loads(state.read_text())["layers_done"] >= 2
        except (OSError, ValueError, KeyError):
            return False

    deadline = time.time() + 120
    while not two_layers_saved() and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    p.kill()
    p.wait()
    assert two_layers_saved() and not out.exists(), "the run was not killed after its second layer"
    r = qf.quantize(FIXTURE, recipe, out, calib=samples, threads=2, progress=False, resume=True)
    assert r.report["totals"]["resumed_layers"] >= 2
    assert r.report["invocation"].endswith(", resume=True)")
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "ref/model.safetensors").read_bytes()
    assert [l["error"] for l in r.report["linears"]] == [l["error"] for l in ref.report["linears"]]
    assert not (tmp_path / ".out.resume").exists()


def test_mixture_of_experts_model(tmp_path):
    moe = FIXTURE.parent / "fixture-mixtral"
    got = qf.bench(moe, prompt=16, gen=4, threads=2)
    assert got["parameters"] - got["active_parameters"] == 3 * 6 * 3 * 256 * 256  # 6 of 8 experts idle per token
    qf.convert(moe, tmp_path / "m.gguf", type="Q8_0")
    hf, gguf = qf.Model(moe), qf.Model(tmp_path / "m.gguf")
    assert hf.config["num_local_experts"] == 8
    assert (gguf.config["num_experts"], gguf.config["num_experts_per_tok"], gguf.config["moe_intermediate_size"]) == (8, 2, 256)
    ids = qf.Tokenizer(moe).encode("The President said")
    a, b = hf.logits(ids), gguf.logits(ids)
    assert a.shape == b.shape == (len(ids), 4096)
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()  # Q8_0 weights
