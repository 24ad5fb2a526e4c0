"""examples/quantize_and_compare.ipynb runs headless (nbclient + ipykernel) and
its numbers agree with the module's own evaluation of the files it wrote."""
import json
import os

import pytest

import quantforge as qf
from conftest import EVAL_TEXT, FIXTURE, SOURCE

nbformat = pytest.importorskip("nbformat", reason="python3-nbformat is not installed (scripts/setup.sh installs it)")
nbclient = pytest.importorskip("nbclient", reason="python3-nbclient is not installed (scripts/setup.sh installs it)")
pytest.importorskip("ipykernel", reason="python3-ipykernel is not installed (scripts/setup.sh installs it)")
pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed (scripts/setup.sh installs it)")


def test_notebook_runs_and_its_numbers_hold(tmp_path, monkeypatch):
    nb = nbformat.read(SOURCE / "examples/quantize_and_compare.ipynb", as_version=4)
    monkeypatch.setenv("QF_SOURCE_DIR", str(SOURCE))
    monkeypatch.setenv("QF_WORK", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # A kernel of Debian's /usr/bin/python3, which the module is built for
    # (the `python3` first on PATH may be another one).
    spec = tmp_path / "jupyter/kernels/python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (Debian)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    # the kernel imports the module this test imported (an absolute path: the kernel runs in tmp_path)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(qf.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([package_parent] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == {"gptq", "awq", "q4_k_m"}
    base = qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=4, progress=False)["ppl"]
    for name, r in results.items():
        assert r["base_ppl"] == base, name  # every output compared with the same f16 reference
        again = qf.evaluate(r["path"], EVAL_TEXT, baseline=FIXTURE, max_chunks=4, progress=False)
        assert again["ppl"] == r["ppl"] and again["kld"]["mean"] == r["kld"], name
        assert 1.0 <= r["ppl"] / base < 1.05 and 0 < r["kld"] < 0.05, (name, r)
        assert r["bytes"] == (os.path.getsize(r["path"]) if name == "q4_k_m" else r["bytes"])
    # the chart it drew, and the image shown in the last cell
    assert (tmp_path / "chart/chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("image/png" in o.get("data", {}) for o in nb.cells[-1].outputs)
