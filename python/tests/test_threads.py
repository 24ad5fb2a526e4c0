"""Several Python threads sharing quantforge objects: no crash, and the results of one thread alone.

Each pattern runs in a child interpreter, so that a crash (a segfault in the
extension) fails the test with its output instead of killing pytest. Every
repetition makes new Model objects: the first calls on a fresh Model are the
ones that load its runtime and tokenizer.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import EVAL_TEXT, FIXTURE

REPEATS = 20
MOE = FIXTURE.parent / "fixture-mixtral"

# Runs in the child: `threads_agree(make, work)` calls work(make()) on 4
# threads at once, REPEATS times, each time on a new object from make(), and
# checks every result against work() on one thread alone.
PRELUDE = textwrap.dedent(f"""
    import sys, threading
    import numpy as np
    import quantforge as qf

    FIXTURE, MOE, EVAL_TEXT = {str(FIXTURE)!r}, {str(MOE)!r}, {str(EVAL_TEXT)!r}

    def same(a, b):
        if isinstance(a, np.ndarray):
            return a.shape == b.shape and np.array_equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a if not k.endswith("seconds"))
        return a == b

    def threads_agree(make, works, threads=4):
        works = works if isinstance(works, list) else [works] * threads
        want = [w(make()) for w in works]
        for rep in range({REPEATS}):
            obj, got, errors = make(), [None] * len(works), []
            def run(i):
                try:
                    got[i] = works[i](obj)
                except BaseException as e:  # reported below, with the repetition
                    errors.append(repr(e))
            ts = [threading.Thread(target=run, args=(i,)) for i in range(len(works))]
            for t in ts: t.start()
            for t in ts: t.join()
            assert not errors, (rep, errors)
            for i in range(len(works)):
                assert same(got[i], want[i]), (rep, i)
""")


def run_child(body):
    env = dict(os.environ)
    env.setdefault("QF_THREADS", "2")
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), \
        f"exit {p.returncode}\nstdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr[-4000:]}"


def test_logits_from_four_threads():
    run_child("threads_agree(lambda: qf.Model(FIXTURE), lambda m: m.logits([1, 5, 9, 13] * 8))")


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_generate_from_four_threads(model):
    run_child(f"""
        path = FIXTURE if {model!r} == "dense" else MOE
        threads_agree(lambda: qf.Model(path), lambda m: m.generate("Once upon a time", n=6))
    """)


def test_model_tokenizer_and_module_calls_mixed():
    # Calls with and without progress bars at once: one call's progress=False
    # must not silence the other's bars, nor leave bars on afterwards.
    run_child("""
        import io, contextlib
        import quantforge._progress as p
        p._tqdm = None  # the plain stderr bars
        tok = qf.Tokenizer(FIXTURE)
        ids = tok.encode("The quick brown fox")
        works = [
            lambda m: m.logits(ids),
            lambda m: m.generate("The quick brown fox", n=4, temperature=0.8, seed=3),
            lambda m: qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=1, threads=1, progress=False)["ppl"],
            lambda m: (tok.encode("fox jumps"), tok.decode(ids), m.config["vocab_size"]),
        ]
        threads_agree(lambda: qf.Model(FIXTURE), works)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=1, threads=1, progress=True)
        assert "eval: 1/1 spans" in err.getvalue(), err.getvalue()
    """)


def test_progress_settings_of_overlapping_calls_stay_apart():
    # Two threads, one with bars and one without, overlapping: every shown
    # call draws its bar, and none of the silent call's lines appear.
    run_child("""
        import quantforge._progress as p
        lines = []
        class Bar:
            def __init__(self, label, total, unit): self.label = label
            def update_to(self, done): pass
            def close(self): lines.append(self.label)
        p.make_bar = Bar
        import os, tempfile
        folder = tempfile.TemporaryDirectory()  # removed when the child ends
        out = os.path.join(folder.name, "imatrix.gguf")
        def shown():
            for _ in range(3):
                qf.evaluate(FIXTURE, EVAL_TEXT, max_chunks=1, threads=1, progress=True)
        def silent():
            for _ in range(3):
                qf.imatrix(FIXTURE, EVAL_TEXT, out, ctx=64, chunks=1, threads=1, progress=False, force=True)
        ts = [threading.Thread(target=shown), threading.Thread(target=silent)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert lines.count("eval") == 3 and "imatrix" not in lines, lines
    """)
