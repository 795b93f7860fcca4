#!/usr/bin/env python3
"""bench_hf_collator.py: the Hugging Face way of feeding MLM batches, on mlm.c shards, for
tests/bench_loader.cu to compare against (it runs this script and prints the ratio).

A torch Dataset returns one sample (its token ids, read from the memory-mapped shard); a PyTorch
DataLoader with one worker process shuffles, batches and collates with transformers'
DataCollatorForLanguageModeling (pads to the longest sample in the batch, masks 15%: 80/10/10).
Prints real (non-padding) tokens per second delivered, and a line HF_TOKENS_PER_S=<float>.

Needs torch and transformers (not in tools/requirements.txt; CI does not need them). On Debian:
  apt-get install python3-torch && /usr/bin/python3 -m pip install --break-system-packages transformers==4.40.2
  /usr/bin/python3 tools/bench_hf_collator.py --shards '/tmp/mlmc_bench/train_*.bin'
"""
import argparse
import glob
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare import read_shard  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shards", required=True)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5)
    args = p.parse_args()

    import torch
    import transformers
    from tokenizers import Tokenizer, models
    from torch.utils.data import DataLoader, Dataset
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    paths = sorted(glob.glob(args.shards))
    shards = [read_shard(path, check=False) for path in paths]
    h = shards[0][0]
    first = np.cumsum([0] + [s[0]["num_samples"] for s in shards])

    class ShardDataset(Dataset):
        def __len__(self):
            return int(first[-1])

        def __getitem__(self, i):
            k = int(np.searchsorted(first, i, side="right")) - 1
            _, tokens, offsets = shards[k]
            j = i - first[k]
            return {"input_ids": tokens[offsets[j]:offsets[j + 1]].astype(np.int64).tolist()}

    # A tokenizer object with the shards' vocabulary and special ids (the collator needs one).
    names = {h["pad_id"]: "[PAD]", h["cls_id"]: "[CLS]", h["sep_id"]: "[SEP]", h["mask_id"]: "[MASK]"}
    if h["unk_id"] >= 0:
        names[h["unk_id"]] = "[UNK]"
    vocab = {names.get(i, f"t{i}"): i for i in range(h["vocab_size"])}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                  pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                  unk_token="[UNK]" if h["unk_id"] >= 0 else None)
    collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm=True, mlm_probability=0.15)
    loader = DataLoader(ShardDataset(), batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        collate_fn=collator, generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    next(it)  # the worker's start-up is not counted
    real = positions = 0
    t0 = time.perf_counter()
    for batch in it:
        real += int(batch["attention_mask"].sum())
        positions += batch["input_ids"].numel()
        if time.perf_counter() - t0 >= args.seconds:
            break
    t = time.perf_counter() - t0
    print(f"Hugging Face DataCollatorForLanguageModeling + torch DataLoader (transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {args.workers} worker, batches of {args.batch_size} samples): "
          f"{real / t / 1e6:.3f} M tokens/s ({positions / t / 1e6:.3f} M positions/s with padding)")
    print(f"HF_TOKENS_PER_S={real / t / args.workers:.1f}")


if __name__ == "__main__":
    main()
