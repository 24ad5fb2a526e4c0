"""quantforge: offline LLM quantization and model conversion, from Python.

Every call runs the C++ library in this process (no subprocess). Long calls
release the GIL, draw a progress bar (tqdm when installed; progress=False
silences it) and stop with KeyboardInterrupt on Ctrl-C, leaving nothing under
the output name. Errors are quantforge.Error subclasses, one per kind:
InvalidInput, Unsupported, NotFound, IoError, UsageError, GateFailed,
InternalError; each carries the one-line message the CLI would print.

See __init__.pyi for the signatures and docs/python.md for a walk-through.
"""

import collections.abc as _abc
import json as _json
import os as _os
import tempfile as _tempfile

from ._quantforge import (  # noqa: F401  (re-exported)
    Error,
    GateFailed,
    InternalError,
    InvalidInput,
    IoError,
    Model,
    NotFound,
    Tokenizer,
    Unsupported,
    UsageError,
    __version__,
    bench,
    convert,
    convert_lora,
    evaluate,
    imatrix,
    inspect,
    kv_sweep,
    merge,
)
from . import _quantforge

__all__ = [
    "Error", "GateFailed", "InternalError", "InvalidInput", "IoError", "NotFound", "Unsupported", "UsageError",
    "Model", "Tokenizer", "QuantizeResult", "bench", "convert", "convert_lora", "evaluate", "imatrix", "inspect", "kv_sweep",
    "merge", "quantize",
    "report",
    "__version__",
]


class QuantizeResult:
    """What quantize() did: the output folder and how it got there.

    Attributes: path, format, method, linears, layers, samples, tokens,
    seconds, mean_error, max_error (relative output errors of the Linears),
    output_bytes, peak_rss_bytes, spilled, per_layer (a list of dicts:
    layer, linears, seconds, mean_error, max_error), log (the lines the CLI
    prints per layer), and evaluation (evaluate()'s dict when eval_text was
    given, else None) and report (quantization_report.json, also written
    into the output folder).
    """

    def __init__(self, d):
        self._d = dict(d)
        for k, v in self._d.items():
            setattr(self, k, v)

    def to_dict(self):
        return dict(self._d)

    def __repr__(self):
        return (f"QuantizeResult(path={self.path!r}, format={self.format!r}, method={self.method!r}, "
                f"linears={self.linears}, mean_error={self.mean_error:.4g}, seconds={self.seconds:.1f})")


# What a path argument may be: the extension encodes each as the file system does.
_PATH_TYPES = (str, bytes, _os.PathLike)

# Nesting a recipe dict may have. The deepest recipe key sits about 6 levels
# down; far deeper structures would only exhaust the JSON encoder's recursion
# (a RecursionError) or the YAML parser's depth limit.
_MAX_RECIPE_DEPTH = 64


def _check_recipe_depth(recipe):
    """UsageError when the dict/list structure of `recipe` nests deeper than _MAX_RECIPE_DEPTH."""
    stack = [(recipe, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                if depth + 1 > _MAX_RECIPE_DEPTH:
                    raise UsageError(f"recipe: the dict nests deeper than {_MAX_RECIPE_DEPTH} levels; "
                                     "no recipe key is that deep")
                stack.append((child, depth + 1))


def _recipe_file(recipe, folder):
    """A path to a recipe file for `recipe`: a path, a YAML string or a dict."""
    if isinstance(recipe, dict):
        _check_recipe_depth(recipe)
        path = _os.path.join(folder, "recipe.yaml")
        with open(path, "w", encoding="utf-8") as f:
            _json.dump(recipe, f, indent=1)  # JSON is YAML: positions in errors stay meaningful
        return path
    if isinstance(recipe, bytes):
        recipe = _os.fsdecode(recipe)  # a path given as bytes
    if isinstance(recipe, (str, _os.PathLike)):
        text = _os.fspath(recipe)
        if isinstance(text, bytes):
            return text
        if "\n" not in text and _os.path.exists(text):
            return text
        if "\n" in text or ":" in text:
            path = _os.path.join(folder, "recipe.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return path
        raise NotFound(f"{text}: no such recipe file (give a path, a YAML string or a dict)")
    raise UsageError(f"recipe must be a path, a YAML string or a dict, got {type(recipe).__name__}")


def _calib_file(calib, folder):
    if calib is None:
        return ""
    if isinstance(calib, _PATH_TYPES):
        return calib  # a path: the extension encodes it as the file system does
    if isinstance(calib, (_abc.Mapping, _abc.Set, _abc.MappingView)):
        # Iterating a dict yields its keys; a set has no defined order, so
        # the samples (and the result) would change from run to run.
        raise UsageError(f"calib: a {type(calib).__name__} is not a list of samples; "
                         "give a path or a list of strings")
    samples = list(calib)
    if not samples or not all(isinstance(s, str) for s in samples):
        raise UsageError("calib must be a path or a non-empty list of strings")
    for i, s in enumerate(samples):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInput(f"calib[{i}]: the sample is not valid Unicode text: "
                               f"{s[e.start]!r} at character {e.start} is a lone surrogate") from None
    path = _os.path.join(folder, "calibration.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(_json.dumps({"text": s}) + "\n")
    return path


def quantize(model, recipe, out, calib=None, threads=None, max_memory=None, progress=True,
             allow_nonfinite=False, eval_text=None, eval_max_chunks=0, resume=False, device="cpu", lora=None):
    """Quantizes `model` with `recipe` into the folder `out` (see __init__.pyi)."""
    if isinstance(max_memory, str):
        max_memory = _quantforge._parse_memory_size(max_memory)
    elif max_memory is None:
        max_memory = 0
    elif not isinstance(max_memory, int) or max_memory < 0:
        raise UsageError("max_memory must be a size string ('8G') or a number of bytes")
    call = (f"quantforge.quantize({_os.fsdecode(model)!r}, recipe={_describe(recipe)}, out={_os.fsdecode(out)!r}"
            f"{'' if lora is None else ', lora=' + repr(lora)}"
            f"{'' if calib is None else ', calib=' + _describe(calib)}"
            f"{'' if eval_text is None else ', eval_text=' + repr(_os.fsdecode(eval_text))}"
            f"{', resume=True' if resume else ''}"
            f"{'' if device == 'cpu' else ', device=' + repr(device)})")
    with _tempfile.TemporaryDirectory(prefix="quantforge-") as folder:
        d = _quantforge._quantize(model, _recipe_file(recipe, folder), out, _calib_file(calib, folder),
                                  threads=threads, max_memory=max_memory, allow_nonfinite=allow_nonfinite,
                                  progress=progress, eval_text="" if eval_text is None else eval_text,
                                  eval_max_chunks=eval_max_chunks,
                                  invocation=call, resume=resume, device=device, lora=lora,
                                  # samples given as a list live nowhere else: the output keeps them
                                  copy_calibration=calib is not None and not isinstance(calib, _PATH_TYPES))
    d["evaluation"] = d["report"]["evaluation"]
    return QuantizeResult(d)


def _describe(x):
    """A short stand-in for an argument in the recorded call."""
    if isinstance(x, _PATH_TYPES):
        text = _os.fsdecode(x)
        return repr(text) if "\n" not in text else "<YAML text>"
    if isinstance(x, dict):
        return "<dict>"
    return f"<{type(x).__name__} of {len(x)} samples>" if hasattr(x, "__len__") else "<iterable>"


def report(paths, out, force=False):
    """Perplexity- and KL-versus-size chart (out/chart.png, out/index.html, out/report.json) of
    quantize output folders (evaluated with eval_text) and eval JSON files; returns the rows.
    Existing report files in `out` are replaced only with force=True; `out` may never be or lie
    inside an input."""
    from . import chart as _report_module

    # Bad inputs and outputs raise the library's errors (InvalidInput, NotFound, IoError, ...).
    return _report_module.render(paths, out, force=force)
