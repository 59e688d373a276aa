"""Train one Hugging Face GPT-2 on Tiny Shakespeare and save it as a Hugging Face folder.

The models of the reference comparison (``benchmarks/reference_comparison.py``):
both lmckit and the paper's code read the same folders. Training uses ``transformers``'
``GPT2LMHeadModel`` (eager attention, tied embeddings, GPT-2's initialisation) in a plain
loop: AdamW, linear warm-up then cosine decay, gradient clipping at 1, early stopping on
the validation loss (the best model is kept). The data are lmckit's
(:func:`lmckit.data._token_stats.text_prefix`: contiguous 90/5/5 split, blocks of
``--context`` tokens), at the character level (``--tokenizer char``: a ``tokenizer.json``
over the text's 65 characters is written beside the model) or with a BPE
``tokenizer.json`` (``--tokens N`` keeps the first N ids and compacts the vocabulary).
The folder also gets ``lmckit_data.json`` (how to rebuild the split) and
``training.json`` (losses per epoch, steps, seconds).

    nice .venv/bin/python scripts/train_hf_gpt2.py /work/runs/hf-char48/seed0 --seed 0 \
        --tokenizer char --n-layer 2 --n-head 4 --n-embd 48 --context 128 --epochs 6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
from torch.nn.functional import cross_entropy

from lmckit.data import Dataset
from lmckit.data._token_stats import text_prefix

CHAR_TOKENIZER = "tokenizer.json"


def char_tokenizer(text: Path, out: Path) -> Path:
    """Write a ``tokenizer.json`` that maps every character of ``text`` to its sorted index."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    content = text.read_text(encoding="utf-8")
    vocab = {c: i for i, c in enumerate(sorted(set(content)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    path = out / CHAR_TOKENIZER
    tok.save(str(path))
    return path


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    """Mean next-token cross-entropy of ``model`` on blocks ``x -> y``."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = model(input_ids=x[i : i + batch]).logits
            yb = y[i : i + batch]
            total += float(cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum"))
            count += yb.numel()
    return total / count


def train(args: argparse.Namespace, data: Dataset, out: Path) -> dict:
    """Train the model in ``out`` (a fresh folder) and return its training record."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    config = GPT2Config(
        vocab_size=data.num_classes,
        n_positions=args.context,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_inner=args.n_inner or 4 * args.n_embd,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=args.lr,
    )
    x, y = data.x_train, data.y_train
    steps_per_epoch = math.ceil(len(x) / args.batch_size)
    total = steps_per_epoch * args.epochs
    warm = max(1, int(args.warmup * total))

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(args.seed)
    best, best_state, bad, history, step = math.inf, None, 0, [], 0
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), args.batch_size):
            idx = order[i : i + args.batch_size]
            logits = model(input_ids=x[idx]).logits
            loss = cross_entropy(logits.flatten(0, 1), y[idx].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
        val = evaluate(model, data.x_val, data.y_val, args.eval_batch)
        history.append({"epoch": epoch, "step": step, "val_loss": val})
        print(f"seed {args.seed} epoch {epoch}: val {val:.4f}", flush=True)
        if val < best - 1e-4:
            best, bad = val, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
            if bad > args.patience:
                break
    assert best_state is not None
    model.load_state_dict(best_state)
    test = evaluate(model, data.x_test, data.y_test, args.eval_batch)
    model.save_pretrained(out, safe_serialization=True)
    return {
        "seed": args.seed,
        "steps": step,
        "epochs": history[-1]["epoch"],
        "best_val_loss": best,
        "test_loss": test,
        "seconds": time.perf_counter() - start,
        "history": history,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="new folder for the model (must not exist)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument(
        "--tokenizer", default="char", help="'char' or a tokenizer.json / its folder"
    )
    parser.add_argument("--tokens", type=int, default=None, help="BPE: keep the first N ids")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=48)
    parser.add_argument("--n-inner", type=int, default=None, help="default 4 * n_embd")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--patience", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    if out.exists():
        raise SystemExit(f"{out} exists; give a new folder")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        text = args.data_root / "tinyshakespeare" / "input.txt"
        if args.tokenizer == "char":
            tokenizer = char_tokenizer(text, tmp)
        else:
            tokenizer = Path(args.tokenizer).resolve()
        data = text_prefix(
            text, tokenizer, block=args.context, tokens=args.tokens, name="tinyshakespeare"
        )
        record = train(args, data, tmp)
        # the data recipe, so the comparison rebuilds exactly this split
        where = out / CHAR_TOKENIZER if args.tokenizer == "char" else tokenizer
        recipe = {
            "text": str(text.resolve()),
            "tokenizer": str(where),
            "block": args.context,
            "tokens": args.tokens,
        }
        (tmp / "lmckit_data.json").write_text(json.dumps(recipe, indent=2))
        (tmp / "training.json").write_text(json.dumps(record, indent=2))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(json.dumps({k: v for k, v in record.items() if k != "history"}))


if __name__ == "__main__":
    main()
