"""Type stubs and documentation of the quantforge module.

Threads: every call may run on several threads at once. A Model loads its runtime once (other
threads wait for that load) and then runs logits/generate concurrently, each call with its own
state; a Tokenizer is read-only; progress= applies to its own call only. Paths are str, bytes
or os.PathLike, as os.fsencode gives them to the file system.
"""

import os
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

PathLike = Union[str, bytes, os.PathLike]
# One LoRA adapter ("DIR", "DIR:SCALE", a path, or a (path, scale) pair) or a list of them.
LoraArg = Union[PathLike, Tuple[PathLike, float], List[Union[PathLike, Tuple[PathLike, float]]]]

__version__: str

class Error(Exception):
    """Base of every quantforge error; str(e) is the one-line message."""

class InvalidInput(Error, ValueError):
    """A malformed or inconsistent file, shape or value (CLI exit 3)."""

class Unsupported(Error):
    """Well-formed but not supported: architecture, dtype, feature (exit 4)."""

class IoError(Error, OSError):
    """A file could not be opened, read, written or renamed (exit 5)."""

class NotFound(Error):
    """A named file, tensor or key is missing (exit 6)."""

class UsageError(Error, ValueError):
    """An argument out of range or an impossible combination (exit 2)."""

class GateFailed(Error):
    """An evaluation gate failed (exit 10). evaluate() reports gates in its dict instead."""

class InternalError(Error):
    """A bug (exit 1)."""

def inspect(model: PathLike, revision: str = "main") -> Dict[str, Any]:
    """A model's architecture, dimensions, tensors and files: `quantforge inspect --json`'s object.

    model: a Hugging Face folder, a cache folder or ORG/NAME in the cache, or a .gguf file.
    """

def evaluate(model: PathLike, text: PathLike, baseline: Optional[PathLike] = None, ctx: int = 0,
             mode: str = "chunks", max_chunks: int = 0, kv_dtype: str = "f16", bos_per_line: bool = False,
             keep_tail: bool = False, max_ppl_delta: Optional[float] = None, max_ppl_ratio: Optional[float] = None,
             max_kld: Optional[float] = None, threads: Optional[int] = None, progress: bool = True,
             device: str = "cpu", kv_k_dtype: str = "", kv_v_dtype: str = "", kv_rotation: str = "none",
             baseline_kv_dtype: str = "f16", lora: Optional[LoraArg] = None, lora_mode: str = "auto",
             baseline_lora: Optional[LoraArg] = None, baseline_lora_mode: str = "auto") -> Dict[str, Any]:
    """Perplexity of `model` on the UTF-8 file `text`: `quantforge eval --json`'s keys.

    kv_dtype (both sides, or a TurboQuant preset), kv_k_dtype / kv_v_dtype (one side each) and
    kv_rotation ("none" or "hadamard") choose the KV cache; the baseline's is baseline_kv_dtype
    (f16). With baseline equal to model the KL is the cache's own; "kld_by_position" has it per
    512 positions.

    With `baseline`, also KL divergence and top-1 agreement against it on the same
    tokens. Gate bounds are reported under "gate" ({"passed": bool, "failures": [...]}); they must
    be finite (max_ppl_ratio > 0, max_kld >= 0), else UsageError: a NaN bound would pass anything.
    "valid" is False (with "problems") when the measurement cannot be trusted.
    ctx=0 takes the mode's default (512 for chunks and lines, 2048 for windows).
    device: where the forward passes run: "cpu" (the runtime), "cuda", "auto" or "host" (the
    device decoder built for the CPU); f16 KV cache only on a device.
    lora: LoRA adapters loaded with the model (a PEFT folder, "DIR:SCALE", a (path, scale) pair, or a
    list of them, applied in order; GGUF adapters for a .gguf model); lora_mode "merge", "forward"
    (applied unmerged in the forward) or "auto" (merged where the base is an unquantized Hugging
    Face model). baseline_lora / baseline_lora_mode the same for the baseline. docs/lora.md.
    """

def kv_sweep(model: PathLike, text: PathLike, ctx: int = 0, mode: str = "windows", max_chunks: int = 4,
             max_kld: Optional[float] = None, types: List[str] = [], decode_tokens: int = 32,
             threads: Optional[int] = None, progress: bool = True) -> Dict[str, Any]:
    """Every KV-cache format on `model` (`quantforge kv-sweep --json`'s keys): per format ("rows")
    bytes per token, tokens per GiB, KL divergence against the f16 cache (mean, p99, by
    position), perplexity, decode tokens/s at long context, and the vLLM / llama.cpp flags; with
    max_kld, "best" names the smallest format within it. ctx=0: the model's context, at most 2048.
    """

def bench(model: PathLike, prompt: int = 512, gen: int = 128, batch: int = 1, kv_dtype: str = "f16",
          reps: int = 1, threads: Optional[int] = None, device: str = "cpu", lora: Optional[LoraArg] = None,
          lora_mode: str = "auto") -> Dict[str, Any]:
    """Prefill and decode tokens/s, KV-cache bytes, peak RSS: `quantforge bench --json`'s keys.

    device: "cpu", "cuda", "auto" or "host" as in evaluate(); one sequence (batch 1) on a device.
    """

def convert(model: PathLike, out: PathLike, type: Optional[str] = None, imatrix: Optional[PathLike] = None,
            force: bool = False, allow_nonfinite: bool = False, threads: Optional[int] = None,
            progress: bool = True, output_tensor_type: Optional[str] = None,
            token_embedding_type: Optional[str] = None, target_bpw: Optional[float] = None,
            target_size: Optional[str] = None, calib: Optional[PathLike] = None, types: Optional[str] = None,
            dry_run: bool = False, json: Optional[PathLike] = None, sensitivity: Optional[PathLike] = None,
            probe_spans: int = 4, max_probes: int = 64, lora: Optional[LoraArg] = None) -> Dict[str, Any]:
    """Hugging Face model -> GGUF file `out` with a llama-quantize preset (`type`, default Q4_K_M:
    F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M, Q2_K, ...), optionally weighted by an importance matrix;
    or, with `target_bpw` (bits per weight) or `target_size` ("4.2GiB"), every tensor's type chosen by
    measured sensitivity to fit that size (`calib` text required; `types` restricts the menu;
    `sensitivity` an earlier plan to solve again; `dry_run` plans only). `convert --to gguf` on the CLI.

    Returns path, type, input_bytes, output_bytes, parameters, bits_per_weight, seconds,
    tensor_types ({gguf name: ggml type}) and notes; with a budget also plan (what OUT.mix.json holds)
    and plan_path. A dry run returns plan and notes only.
    lora: adapters merged into the model before conversion (as in evaluate()).
    """

def merge(model: PathLike, out: PathLike, lora: LoraArg) -> Dict[str, Any]:
    """The Hugging Face `model` with the LoRA adapters `lora` merged (f32 arithmetic, one rounding to
    the model's dtype), written to the new folder `out` with the model's other files:
    `quantforge merge`. Returns path, tensors, merged (tensors an adapter changed), bytes, lora.
    """

def convert_lora(adapter: PathLike, base: PathLike, out: PathLike, type: str = "F16",
                 force: bool = False) -> Dict[str, Any]:
    """A PEFT LoRA adapter of the Hugging Face model `base` -> llama.cpp's LoRA adapter GGUF
    (`quantforge convert ADAPTER --to gguf-lora --base MODEL`). Returns path, alpha, tensors,
    rescaled (lora_b tensors carrying a module's own scale), bytes.
    """

def imatrix(model: PathLike, text: PathLike, out: PathLike, ctx: int = 512, chunks: int = 0,
            process_output: bool = False, force: bool = False, allow_nonfinite: bool = False,
            threads: Optional[int] = None, progress: bool = True, device: str = "cpu",
            lora: Optional[LoraArg] = None, lora_mode: str = "auto") -> Dict[str, Any]:
    """Importance matrix of `model` on `text`, written to `out` in llama.cpp's GGUF imatrix layout.

    device: "cpu", "cuda", "auto" or "host" as in evaluate().
    """

class QuantizeResult:
    path: str
    format: str
    method: str
    linears: int
    layers: int
    samples: int
    tokens: int
    seconds: float
    mean_error: float
    max_error: float
    output_bytes: int
    peak_rss_bytes: int
    spilled: bool
    per_layer: List[Dict[str, Any]]
    log: List[str]
    evaluation: Optional[Dict[str, Any]]
    report: Dict[str, Any]
    """quantization_report.json, also written into the output folder."""
    def to_dict(self) -> Dict[str, Any]: ...

def quantize(model: PathLike, recipe: Union[PathLike, str, Dict[str, Any]], out: PathLike,
             calib: Union[None, PathLike, List[str], Iterable[str]] = None, threads: Optional[int] = None,
             max_memory: Union[None, str, int] = None, progress: bool = True, allow_nonfinite: bool = False,
             eval_text: Optional[PathLike] = None, eval_max_chunks: int = 0, resume: bool = False,
             device: str = "cpu", lora: Optional[LoraArg] = None) -> QuantizeResult:
    """Quantizes `model` with a recipe into the new folder `out`
    (compressed-tensors, GPTQ, AutoAWQ or modelopt layout, as the recipe says).

    recipe: a path, a YAML string, or a dict in llm-compressor's layout
    ({"quant_stage": {"quant_modifiers": {"GPTQModifier": {...}}}}).
    calib: a .txt or .jsonl path, or a list of strings (one sample each; a dict or set is a
    UsageError, a sample with a lone surrogate InvalidInput naming calib[i]);
    None uses the recipe's calibration.dataset. A recipe dict may nest at most 64 levels.
    max_memory: budget for calibration activations ("8G" or bytes); beyond it they spill to disk.
    eval_text: evaluate the output against `model` on this text before it is moved into place
    (result.evaluation, and the report's "evaluation"); eval_max_chunks: score only that many
    chunks (0: all).
    resume: continue a run to the same `out` that was interrupted (killed, Ctrl-C) from its last
    finished layer, when the inputs are the same; the result is byte-identical to an uninterrupted run.
    device: where the weight quantizers run: "cpu" (the reference), "cuda" (UnsupportedError when
    no CUDA device is usable, with the reason), "auto" (cuda when usable, else cpu) or "host" (the
    device code built for the CPU; the same bytes as "cpu").
    lora: LoRA adapters merged into `model` first (as in evaluate()): calibration, the quantized
    weights, the copied tensors and the evaluation's baseline all see the merged model.
    """

def report(paths: Union[PathLike, List[PathLike]], out: PathLike, force: bool = False) -> List[Dict[str, Any]]:
    """Perplexity- and KL-versus-size chart of several outputs of one model: quantize output folders
    (with the evaluation quantize(eval_text=...) or `quantize --eval` recorded) and eval JSON files
    (`eval --baseline ... --json`, e.g. of GGUF files). Writes out/chart.png (matplotlib),
    out/index.html and out/report.json; returns the reference's row and one per output
    (name, bytes, ppl, kld, top1). InvalidInput when an input has no valid baseline comparison
    or the inputs disagree on the reference or the text."""

class Tokenizer:
    """The tokenizer of a model folder, cache id or .gguf file."""
    def __init__(self, model: PathLike) -> None: ...
    def encode(self, text: str, add_bos: bool = True) -> List[int]: ...
    def decode(self, ids: List[int]) -> str: ...
    @property
    def vocab_size(self) -> int: ...

class Model:
    """A model folder, cache id or .gguf file: its tensors (memory-mapped) and its runtime.

    Safe to share between threads: the runtime is loaded once, on first use, and logits() and
    generate() then run concurrently, each with its own KV cache (results as on one thread)."""
    def __init__(self, model: PathLike) -> None: ...
    @property
    def config(self) -> Dict[str, Any]:
        """config.json as a dict (a GGUF file: the hyper-parameters the runtime uses)."""
    @property
    def source(self) -> str: ...
    def tensor_names(self) -> List[str]: ...
    def tensor(self, name: str, dequantize: bool = False) -> np.ndarray:
        """A read-only view of the tensor in the mapped file, without a copy: float32 and float16
        as they are, bfloat16 as its raw uint16 bits (NumPy has no bfloat16), integer tensors as
        their integer type. dequantize=True returns a float32 copy of anything, quantized GGUF
        blocks included. Shapes are row-major (a GGUF tensor's dims reversed)."""
    def logits(self, token_ids: List[int], threads: Optional[int] = None) -> np.ndarray:
        """[len(token_ids), vocab] float32 logits of one sequence (position i sees tokens 0..i)."""
    def generate(self, prompt: str, n: int = 32, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 threads: Optional[int] = None) -> Dict[str, Any]:
        """Greedy (temperature 0) or sampled continuation: text (prompt and continuation, as
        `quantforge generate` prints it), completion (the continuation alone), prompt_tokens,
        tokens (the generated ids), stopped (EOS before n), prefill_seconds, decode_seconds."""
