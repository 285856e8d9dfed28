"""A small local stand-in for the Hugging Face Hub, and the emulated Trainer initializer that reads it.

There is no hub access where the emulator and the tests run, so ``build`` writes, for the repo ids a
rendered TrainJob names, tiny repos with the files and layout the real ones have:

* a dataset ``datasets/<owner>/<name>/data/{train,test}-00000-of-00001.parquet`` with ``text``,
  ``summary`` and ``title`` columns (the layout and features of ``FiscalNote/billsum``: its dataset
  card's ``configs.data_files`` ``data/train-*``, ``data/test-*``, ``data/ca_test-*`` and
  ``dataset_info.features``), generated sentences whose summary is learnable from the text;
* a model ``models/<owner>/<name>/``: a tiny random T5 saved with ``save_pretrained``
  (``config.json``, ``generation_config.json``, ``model.safetensors``) and a word-level tokenizer
  built offline with ``tokenizers`` (``tokenizer.json``, ``tokenizer_config.json``) with T5's special
  token ids (pad 0, eos 1, unk 2).

``python -m tools.fixture_hub initialize`` is what the emulator runs for a replicated job the
Trainer fills from ``TrainJob.spec.initializer`` (container ``dataset-initializer`` /
``model-initializer``). It behaves like the upstream Hugging Face initializers
(kubeflow/trainer pkg/initializers, v2.1.0 and v2.3.0) against the local hub: ``STORAGE_URI`` is
required (``KeyError`` otherwise, exit 1); a dataset is repo ``<netloc>/<first path segment>``, every
file; a model is repo ``<netloc><path>``, only ``*.json``, ``*.safetensors``, ``*.model``, ``*.txt``,
minus the default ignore patterns; ``IGNORE_PATTERNS`` (comma separated) replaces those; files go to
``<workspace>/dataset`` or ``<workspace>/model``. A file already there with the same size is kept
(what the hub client's ``local_dir`` download does for unchanged files), so a restart re-copies
nothing.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import random
import shutil
import sys
from urllib.parse import urlparse

from k8s.builders import trainer_api

FIXTURE_ROWS = 1024  # enough for the tiny profile's 12 steps x batch 4 on up to 16 processes
TINY_T5 = {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 16, "vocab_size": 512}
SPECIAL = ["<pad>", "</s>", "<unk>"]  # T5's ids 0, 1, 2
WORDS = [f"w{i}" for i in range(200)]

# upstream pkg/initializers/model/huggingface.py allow_patterns, types.py default ignore_patterns
MODEL_ALLOW = ("*.json", "*.safetensors", "*.model", "*.txt")
MODEL_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
KINDS = {trainer_api.DATASET_INITIALIZER: "dataset", trainer_api.MODEL_INITIALIZER: "model"}


def repo_id(uri: str, kind: str) -> str:
    """The hub repo an ``hf://`` STORAGE_URI names, as the upstream initializer of ``kind`` reads it."""
    parsed = urlparse(uri)
    if parsed.scheme != "hf":
        raise ValueError(f"STORAGE_URI {uri!r}: only hf:// is emulated")
    if kind == "dataset":
        return parsed.netloc + "/" + parsed.path.split("/")[1]  # IndexError for an id without owner, as upstream
    return parsed.netloc + parsed.path


def repo_dir(hub: str, kind: str, repo: str) -> str:
    return os.path.join(hub, f"{kind}s", *repo.split("/"))


def _rows(n: int, seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    text, summary, title = [], [], []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 24))]
        text.append(" ".join(words))
        summary.append(" ".join(sorted(set(words))[:6]))  # learnable from the text
        title.append(f"bill {i}")
    return {"text": text, "summary": summary, "title": title}


def build_dataset(path: str, rows: int = FIXTURE_ROWS) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(path, "data"), exist_ok=True)
    for split, n, seed in (("train", rows, 1), ("test", max(16, rows // 8), 2)):
        pq.write_table(pa.table(_rows(n, seed)), os.path.join(path, "data", f"{split}-00000-of-00001.parquet"))
    with open(os.path.join(path, "README.md"), "w") as fh:
        fh.write("Fixture: billsum-shaped generated rows (text, summary, title).\n")


def build_model(path: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    os.makedirs(path, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS + ["summarize:"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])  # T5 appends eos
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>").save_pretrained(path)
    torch.manual_seed(0)
    config = T5Config(**TINY_T5, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # pyright: ignore[reportCallIssue]
    T5ForConditionalGeneration(config).save_pretrained(path)
    with open(os.path.join(path, "pytorch_model.bin"), "wb") as fh:  # a file the model initializer skips
        fh.write(b"not downloaded")


def build(hub: str, *, datasets: list[str], models: list[str]) -> None:
    """Tiny stand-ins for the named dataset and model repos (ids, not URIs) under ``hub``."""
    for repo in datasets:
        if not os.path.isdir(repo_dir(hub, "dataset", repo)):
            build_dataset(repo_dir(hub, "dataset", repo))
    for repo in models:
        if not os.path.isdir(repo_dir(hub, "model", repo)):
            build_model(repo_dir(hub, "model", repo))


def _wanted(rel: str, kind: str, ignore: tuple[str, ...] | None) -> bool:
    name = os.path.basename(rel)
    if kind == "model" and not any(fnmatch.fnmatch(name, p) for p in MODEL_ALLOW):
        return False
    ignored = ignore if ignore is not None else (MODEL_IGNORE if kind == "model" else ())
    return not any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in ignored)


def initialize(*, kind: str, uri: str, hub: str, workspace: str, ignore: tuple[str, ...] | None = None) -> tuple[int, int]:
    """Copy the repo ``uri`` names from ``hub`` to ``<workspace>/<kind>``; (copied, kept)."""
    src = repo_dir(hub, kind, repo_id(uri, kind))
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{uri}: no {kind} repo {repo_id(uri, kind)} in the local hub {hub}")
    dest = os.path.join(workspace, kind)
    copied = kept = 0
    for root, _, files in os.walk(src):
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), src)
            if not _wanted(rel, kind, ignore):
                continue
            target = os.path.join(dest, rel)
            if os.path.exists(target) and os.path.getsize(target) == os.path.getsize(os.path.join(src, rel)):
                kept += 1
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(src, rel), target + ".incomplete")
            os.replace(target + ".incomplete", target)
            copied += 1
    return copied, kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="local Hugging Face Hub fixture and emulated Trainer initializer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write tiny repos into a hub directory")
    b.add_argument("hub")
    b.add_argument("--dataset", action="append", default=[])
    b.add_argument("--model", action="append", default=[])
    i = sub.add_parser("initialize", help="the emulated initializer (env STORAGE_URI, like the Trainer's)")
    i.add_argument("--kind", choices=sorted(set(KINDS.values())), required=True)
    i.add_argument("--hub", required=True)
    i.add_argument("--workspace", required=True, help="the local directory the initializer's /workspace maps to")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.hub, datasets=args.dataset, models=args.model)
        return 0
    uri = os.environ[trainer_api.STORAGE_URI_ENV]  # required, as upstream: a KeyError fails the pod
    patterns = os.environ.get("IGNORE_PATTERNS")
    ignore = tuple(p.strip() for p in patterns.split(",") if p.strip()) if patterns else None
    copied, kept = initialize(kind=args.kind, uri=uri, hub=args.hub, workspace=args.workspace, ignore=ignore)
    print(f"initializer: {args.kind} {uri}: {copied} files copied, {kept} already there", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
