"""Build the lab's tiny Llama target model locally: nothing is downloaded.

A byte-level BPE tokenizer is trained with the ``tokenizers`` library on the bundled corpus, and a small
``LlamaForCausalLM`` starts from random weights (fixed seed) and is trained briefly on the corpus's
conversations (loss on the replies). A random network is useless as a lab target: its logits are nearly
uniform (a drafter stays near 1 % accuracy) and, sharpened, its greedy output falls into the same loop for
every prompt. The briefly trained one answers each prompt confidently and differently, like a real target.
``--sharpen`` can still scale the output head on top.

The directory is written under a temporary name and renamed into place when complete, with the build
arguments in ``eagle3_lab_target.json``; a rerun with the same arguments leaves it alone (exit 0, "unchanged").
Builders of one directory are serialised by a lock beside it (``.NAME.lock``): on a fleet every trainer runs this
against the one shared storage, and the second one waits for the first and then finds its build "unchanged" (two
builds at once would each train the model and then replace each other's directory). A rebuild moves the old
directory aside, renames the new one in and only then removes the old one.

With ``--cache DIR`` (the lab mounts one machine-wide directory into every container) a target built before on
this machine with the same arguments, corpus, builder code, Python and library versions is copied from there instead
of trained again, and a new build is kept there (each lab, its fleet and the molecule scenarios build the same
target; training it takes about half a minute on two cores). The entry is keyed by a hash of all of that, written
under a temporary name and renamed into place when complete; a cache that is missing, full or read-only only costs
the build. The four newest entries are kept.

Usage: python3 -m lab_target.tiny_target --corpus prompts.jsonl --out /srv/eagle3/models/tiny-llama
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

MARKER = "eagle3_lab_target.json"
CACHE_KIND = "tiny-target"  # the builder's subdirectory of the shared cache
CACHE_KEEP = 4  # entries kept in the cache (older ones are removed when a build is kept)
# A chat template small enough to read: the server and the data stage both format turns with it.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def read_corpus(path: str) -> list[tuple[str, str]]:
    pairs = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row.get("prompt"), str) or not isinstance(row.get("reply"), str):
                    raise SystemExit(f"{path}:{n} needs string fields 'prompt' and 'reply'")
                pairs.append((row["prompt"], row["reply"]))
    if not pairs:
        raise SystemExit(f"{path} is empty: give a JSONL file of {{'prompt': ..., 'reply': ...}} rows")
    return pairs


def build_tokenizer(texts: list[str], vocab_size: int, out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>",  # noqa: S106
                                   pad_token="<|pad|>")  # noqa: S106  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def encode_pairs(tok: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], int]]:
    """Each conversation as token ids and the index where the reply starts."""
    rows = []
    for prompt, reply in pairs:
        head = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=True)  # fmt: skip
        head = list(head["input_ids"] if hasattr(head, "keys") else head)
        rows.append((head + tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id], len(head)))
    return rows


def build_model(out: str, tok: Any, pairs: list[tuple[str, str]], args: argparse.Namespace) -> float:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab_size = len(tok)
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32",
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    rows = encode_pairs(tok, pairs)
    width = max(len(ids) for ids, _unused in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (row, start) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, start : len(row)] = torch.tensor(row[start:])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    loss = torch.tensor(float("nan"))
    model.train()
    for _unused in range(args.steps):
        pick = torch.randint(0, len(rows), (min(args.batch, len(rows)),), generator=gen)
        loss = model(input_ids=ids[pick], labels=labels[pick]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(args.sharpen)
    model.save_pretrained(out, safe_serialization=True)
    return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tiny_target", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--corpus", required=True, help="JSONL of {prompt, reply} the tokenizer and model learn")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6)
    # head_dim 32 (64 / 2): vLLM's CPU attention backend rejects a head size of 16, which 4 heads would give.
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--max-positions", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300, help="training steps on the corpus")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sharpen", type=float, default=1.0, help="scale of the output head after training")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default="", help="a directory this machine's builds share (see above); '' for none")
    args = ap.parse_args(argv)
    wanted = {k: v for k, v in vars(args).items() if k not in ("out", "cache")}
    wanted["corpus"] = os.path.basename(args.corpus)
    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    with open(os.path.join(parent, f".{os.path.basename(out)}.lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if built_with(out) == wanted:
            print("unchanged")
            return 0
        return build(args, out, wanted)


def built_with(out: str) -> dict[str, Any] | None:
    """The build arguments of the complete target at OUT, or None."""
    try:
        with open(os.path.join(out, MARKER), encoding="utf-8") as fh:
            found: dict[str, Any] = json.load(fh)
            return found
    except (OSError, ValueError):
        return None


def make_target(tmp: str, args: argparse.Namespace) -> tuple[int, float]:
    """Tokenizer and trained weights into TMP: the vocabulary size and the final training loss."""
    pairs = read_corpus(args.corpus)
    build_tokenizer([t for pair in pairs for t in pair], args.vocab_size, tmp)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp)
    return len(tok), build_model(tmp, tok, pairs, args)


def cache_entry(args: argparse.Namespace, wanted: dict[str, Any]) -> str | None:
    """Where a build with these inputs is kept in the cache (--cache), or None without a cache to use."""
    if not args.cache:
        return None
    if not os.path.isdir(args.cache):
        print(f"note: no build cache at {args.cache} (not mounted here): the target is built", file=sys.stderr)
        return None
    inputs: dict[str, Any] = {k: v for k, v in wanted.items() if k != "corpus"}
    for name, path in (("corpus", args.corpus), ("code", __file__)):
        with open(path, "rb") as fh:
            inputs[name] = hashlib.sha256(fh.read()).hexdigest()
    inputs["python"] = list(sys.version_info[:3])
    for dist in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            inputs[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            inputs[dist] = None
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(args.cache, CACHE_KIND, key)


def from_cache(entry: str | None, tmp: str) -> bool:
    """Copy a complete cache entry into TMP; False (TMP emptied) when there is none or it cannot be read whole."""
    if entry is None or not os.path.isfile(os.path.join(entry, MARKER)):
        return False
    try:
        shutil.copytree(entry, tmp, dirs_exist_ok=True)
        os.utime(entry)  # the newest use: pruning keeps the entries used last
        return True
    except OSError as exc:  # removed by a newer build's pruning while copied, say: build instead
        print(f"note: could not copy {entry} ({exc}): the target is built", file=sys.stderr)
        shutil.rmtree(tmp)
        os.mkdir(tmp, 0o700)
        return False


def keep_in_cache(src: str, entry: str) -> None:
    """Put a complete build into the cache (renamed into place when complete) and keep the CACHE_KEEP newest."""
    kind = os.path.dirname(entry)
    part = None
    try:
        os.makedirs(kind, exist_ok=True)
        part = tempfile.mkdtemp(prefix=".part-", dir=kind)
        shutil.copytree(src, part, dirs_exist_ok=True)
        os.chmod(part, 0o755)  # noqa: S103 -- read by every lab container
        if os.path.isdir(entry) and not os.path.isfile(os.path.join(entry, MARKER)):
            shutil.rmtree(entry)  # not one this code wrote (each appears complete): replaced, under the entry's lock
        os.rename(part, entry)  # refused when another builder's entry is there already: theirs stays
        part = None
        entries = sorted((e for e in os.scandir(kind) if e.is_dir() and not e.name.startswith(".")),
                         key=lambda e: e.stat().st_mtime, reverse=True)  # fmt: skip
        for old in entries[CACHE_KEEP:]:
            shutil.rmtree(old.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.remove(os.path.join(kind, f".{old.name}.lock"))
    except OSError as exc:
        if not os.path.isfile(os.path.join(entry, MARKER)):
            print(f"note: the build was not kept in the cache {kind} ({exc})", file=sys.stderr)
    finally:
        if part:
            shutil.rmtree(part, ignore_errors=True)


@contextlib.contextmanager
def cache_lock(entry: str | None) -> Iterator[None]:
    """Hold the lock of one cache entry: builders of the same inputs on this machine (another lab's trainer, say)
    wait for the first and copy its build, where two builds at once would each take twice as long on two cores. No
    lock (nothing to wait for) when the cache has no room for one."""
    lock = None
    if entry is not None:
        try:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            lock = open(f"{os.path.dirname(entry)}/.{os.path.basename(entry)}.lock", "a", encoding="utf-8")  # noqa: SIM115
        except OSError:
            lock = None
    if lock is None:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


def build(args: argparse.Namespace, out: str, wanted: dict[str, Any]) -> int:
    entry = cache_entry(args, wanted)
    with cache_lock(entry):
        return install(args, out, wanted, entry)


def install(args: argparse.Namespace, out: str, wanted: dict[str, Any], entry: str | None) -> int:
    """The target into OUT, complete or not at all: copied from the cache ENTRY when it holds one, else built (and
    kept in the cache)."""
    tmp = tempfile.mkdtemp(prefix=".tiny-target-", dir=os.path.dirname(out))
    try:
        copied = from_cache(entry, tmp)
        if copied:
            said = f"copied {out} from the build cache ({entry}, made on this machine from the same inputs)"
        else:
            vocab, final_loss = make_target(tmp, args)
            said = (f"built {out} (vocab {vocab}, {args.layers} layers, hidden {args.hidden}, "
                    f"final training loss {final_loss:.3f})")  # fmt: skip
        with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as fh:
            json.dump(wanted, fh, indent=1)
        if entry and not copied:
            keep_in_cache(tmp, entry)
        os.chmod(tmp, 0o755)  # noqa: S103 -- a model directory others read (mkdtemp makes it 0700)
        old = None
        if os.path.exists(out):
            old = tempfile.mkdtemp(prefix=".tiny-target-old-", dir=os.path.dirname(out))
            os.rename(out, os.path.join(old, "target"))
        try:
            os.rename(tmp, out)
        except BaseException:
            if old:  # the previous target goes back where it was
                os.rename(os.path.join(old, "target"), out)
                os.rmdir(old)
            raise
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
