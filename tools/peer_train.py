#!/usr/bin/env python3
"""peer_train.py: the peer trained as mlm.c trains, for time to a loss: Hugging Face BertForMaskedLM in PyTorch
on the same shards, schedule and batch as ./trainer, logging the same metrics.jsonl records (tools/plot.py reads
them unchanged; plot.py --overlay mlm.c's run and this one --x time compares them by wall-clock).

    python3 tools/peer_train.py --data 'data/usrlib/train_*.bin' --val 'data/usrlib/val_*.bin' --out runs/peer \\
        --preset mini --seq 256 --global-batch 32 --steps 2000 --val-every 200
    python3 tools/peer_train.py --like runs/mlmc --data ... --val ... --out runs/peer --preset mini
                       # the schedule of an mlm.c run: --steps, --warmup, --lr, --global-batch, --seq from its run.json
    python3 tools/plot.py --overlay runs/mlmc runs/peer --x time --out vs_peer.png --labels mlm.c,peer

The same as ./trainer (the flags have its names and defaults):
  model      bench_peer.py's bert_config: the preset's shape, the shards' vocabulary (meta.json beside them, checked
             against the shard headers), the tanh form of GELU (hidden_act "gelu_pytorch_tanh"), dropout 0, the
             decoder tied to the word embeddings; BERT's initialisation (N(0, 0.02), Hugging Face's _init_weights)
  data       the shards read in place (prepare.read_shard: numpy memmaps, checked as data.h checks them); each epoch
             a new shuffle of the samples, packed into rows of --seq tokens as data.h packs them (best fit among
             16 open rows, whole samples, never split); a sample attends only to itself (compare_hf.py's
             packed_attention_mask, made on the device) and its position ids start at 0; the rest of a row is
             padding, outside the loss
  masking    per sample, exactly floor(0.15 n + u) of its n non-special tokens (u uniform in [0, 1)), chosen
             uniformly; each becomes [MASK] with probability 0.8, a random non-special token with 0.1, unchanged
             with 0.1; special tokens are never chosen; a new masking every epoch
  optimizer  AdamW (--lr 5e-4, --beta1 0.9, --beta2 0.98, --eps 1e-6, --wd 0.01 on matrices and embeddings, not
             on biases and LayerNorm), the gradient norm clipped to --clip 1.0; the learning rate of step s
             (from 1): --lr s / --warmup during the warmup, then linear decay to 0 at --steps (lr_at); --warmup
             defaults to 1% of --steps; a step whose loss or gradient norm is not finite is skipped (3 in a row
             stop the run, exit 2)
  batch      --global-batch rows per step (--batch rows at a time, gradients accumulated); the step's loss is
             the mean over all its masked tokens, each micro-batch's mean weighted 1/accumulation in the gradient
  validation every --val-every steps and at the last: the validation split in file order, packed as training
             packs it, masked once with seed 1337; every sequence once (or the first --val-batches micro-batches
             of --batch rows: give the trainer's --batch x GPUs for the same sequences)
  records    --out/metrics.jsonl: {"kind":"train",...} every --log-every steps (and the first and last), and
             {"kind":"val",...}, with the trainer's fields; elapsed_s is the wall clock from this program's start
             (the import of torch, the shards' check and the model's creation count, as the trainer's start-up
             does); mfu is null. --out/run.json: the schedule (the trainer's keys) and preset, data, device,
             torch and transformers versions
  device     CUDA: bf16 autocast over fp32 weights, SDPA attention (fused AdamW); CPU: fp32 (SDPA, or eager
             attention on a torch without it)

Differences, each small: the shuffle and the masking draw from numpy's generator, not data.h's (the same
distributions, other samples); rows run on from one epoch into the next (mlm.c pads the epoch's last micro-batch);
the head computes logits for every position (Hugging Face's BertForMaskedLM; mlm.c only for the masked ones);
attention takes a dense (B, T, T) mask (so SDPA cannot use its flash kernel), not varlen kernels; one process,
one device.
Needs torch and transformers for training (without them: one line, exit 2); the data, masking and schedule code
needs numpy only (tests/test_peer_train.py tests it without torch).
"""
import argparse
import contextlib
import glob
import json
import math
import os
import queue
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peer import PRESETS, PeerError, bert_config, new_model  # noqa: E402
from prepare import read_shard  # noqa: E402

OPEN_ROWS = 16  # data.h's DATA_OPEN_ROWS: rows being packed at once (best fit among these)
VAL_SEED = 1337  # trainer.cu's VAL_SEED: the validation masking, whatever --seed is
MASK_PROB = 0.15  # data.h's mask_prob: the share of each sample's non-special tokens chosen


class PeerTrainError(Exception):
    """Bad input (a flag, the shards, --out), in one line naming it."""


def fail(msg, code=1):
    print(f"peer_train.py: {msg}", file=sys.stderr)
    sys.exit(code)


# ----------------------------------------------------------------------------
# The schedule (trainer.cu's lr_at and --warmup default).
def default_warmup(steps):
    return steps // 100


def lr_at(step, steps, warmup, lr):
    """The learning rate of step `step` (from 1): linear warmup to lr over `warmup` steps, then linear decay to 0 at
    `steps` (trainer.cu's lr_at)."""
    if step <= warmup:
        return lr * step / (warmup if warmup > 0 else 1)
    left = (steps - step) / (steps - warmup if steps - warmup > 0 else 1)
    return lr * max(left, 0.0)


# ----------------------------------------------------------------------------
# The shards.
class Shards:
    """The samples of the shards a glob names, read in place (memmaps), in file order: sample(g) is sample g's
    tokens, lengths[g] its length. vocab_size and special ids from meta.json beside the first shard (checked
    against every shard's header), or from the headers where there is no meta.json."""

    def __init__(self, pattern, flag):
        paths = sorted(glob.glob(pattern))
        if not paths:
            raise PeerTrainError(f"{flag} {pattern}: no such file (expected shards written by tools/prepare.py)")
        self.pattern, self.paths, self.tokens, firsts, lengths, h0 = pattern, paths, [], [0], [], None
        for p in paths:
            try:
                h, tokens, offsets = read_shard(p)  # checked as data.h's dataloader_init checks it
            except (ValueError, OSError) as e:
                raise PeerTrainError(f"{flag}: {e if isinstance(e, ValueError) else f'{p}: {e.strerror}'}") from None
            if h0 is None:
                h0 = h
            elif any(h[k] != h0[k] for k in ("vocab_size", "pad_id", "cls_id", "sep_id", "mask_id", "unk_id")):
                raise PeerTrainError(f"{flag}: {p}: another vocabulary than {paths[0]} (expected the same)")
            self.tokens.append((tokens, offsets))  # in place: nothing of the shard is copied but the lengths
            lengths.append(np.diff(offsets).astype(np.int32))  # at most 2^24 (prepare.py's --seq-len)
            firsts.append(firsts[-1] + h["num_samples"])
        self.first = np.array(firsts, dtype=np.int64)
        self.lengths = np.concatenate(lengths)
        self.num_samples, self.num_tokens = len(self.lengths), int(self.lengths.sum())
        self.max_len = int(self.lengths.max())
        self.vocab_size = h0["vocab_size"]
        self.special = {k: h0[f"{k}_id"] for k in ("pad", "cls", "sep", "mask", "unk")}
        self.meta = os.path.join(os.path.dirname(paths[0]), "meta.json")
        if os.path.isfile(self.meta):
            try:
                with open(self.meta, "rb") as f:
                    meta = json.loads(f.read())
                vocab, special = meta["vocab_size"], meta["special_ids"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise PeerTrainError(f"{self.meta}: not prepare.py's meta.json ({type(e).__name__}: {e})") from None
            if vocab != self.vocab_size or any(special.get(k) != v for k, v in self.special.items()):
                raise PeerTrainError(f"{self.meta}: vocabulary {vocab} with special ids {special}; the shards' headers"
                                     f" say {self.vocab_size} with {self.special} (expected the same)")
        else:
            self.meta = None

    def sample(self, g):
        s = int(np.searchsorted(self.first, g, side="right")) - 1
        tokens, offsets = self.tokens[s]
        i = int(g - self.first[s])
        return tokens[int(offsets[i]):int(offsets[i + 1])]


def pack(lengths, order, T):
    """Rows of T positions, each a list of whole samples, as data.h's plan_build packs them: each sample in turn (in
    `order`) goes into the fullest of OPEN_ROWS open rows that has room (best fit); when none has, the fullest
    open row is emitted and a new one opened; a row is emitted as soon as it is full; the open rows at the end."""
    open_rows, open_len = [], []
    for g in order:
        n = int(lengths[g])
        best = -1
        for k in range(len(open_rows)):
            if T - open_len[k] >= n and (best < 0 or open_len[k] > open_len[best]):
                best = k
        if best < 0:
            if len(open_rows) == OPEN_ROWS:
                full = max(range(len(open_rows)), key=lambda k: (open_len[k], -k))
                yield open_rows[full]
                best = full
            else:
                open_rows.append(None)
                open_len.append(0)
                best = len(open_rows) - 1
            open_rows[best], open_len[best] = [], 0
        open_rows[best].append(int(g))
        open_len[best] += n
        if open_len[best] == T:
            yield open_rows[best]
            last = len(open_rows) - 1
            open_rows[best], open_len[best] = open_rows[last], open_len[last]
            open_rows.pop()
            open_len.pop()
    yield from open_rows


def train_rows(shards, T, seed):
    """The training rows, epoch after epoch: (epoch, row); each epoch a new shuffle (seeded by seed and epoch)."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(shards.num_samples)
        for row in pack(shards.lengths, order, T):
            yield epoch, row
        epoch += 1


def make_batch(shards, rows, B, T, rng):
    """Micro-batch of B rows (fewer given: the others are all padding) as numpy arrays: ids (the input, masked),
    labels (the original id where masked, -100 elsewhere), position ids, and lo/hi: the flat span [lo, hi) of the
    sample each position belongs to within its row (lo == hi for padding); and the counts."""
    sp = shards.special
    ids = np.full((B, T), sp["pad"], dtype=np.int64)
    lo = np.zeros((B, T), dtype=np.int64)
    hi = np.zeros((B, T), dtype=np.int64)
    sample = np.full((B, T), -1, dtype=np.int64)  # the sample's index in this batch, -1 for padding
    n = 0
    for b, row in enumerate(rows):
        at = 0
        for g in row:
            tok = shards.sample(g)
            ids[b, at:at + len(tok)] = tok
            lo[b, at:at + len(tok)], hi[b, at:at + len(tok)] = at, at + len(tok)
            sample[b, at:at + len(tok)] = n
            n += 1
            at += len(tok)
    position = np.where(hi > lo, np.arange(T)[None, :] - lo, 0)
    ids, labels = mask_tokens(ids, sample, n, shards.special, shards.vocab_size, rng)
    return dict(ids=ids, labels=labels, position=position, lo=lo, hi=hi, tokens=int((sample >= 0).sum()),
                masked=int((labels >= 0).sum()), samples=n)


def mask_tokens(ids, sample, n, special, vocab, rng):
    """data.h's masking (see the docstring) of the n samples in ids ((B, T); sample: each position's sample index,
    -1 for padding): the masked input and the labels."""
    sp = np.array([v for v in special.values() if v >= 0])
    flat, sid = ids.reshape(-1), sample.reshape(-1)
    cand = (sid >= 0) & ~np.isin(flat, sp)
    per = np.bincount(sid[cand], minlength=n)  # each sample's non-special tokens
    need = np.minimum(np.floor(MASK_PROB * per + rng.random(n)).astype(np.int64), per)
    # a uniform subset of `need` candidates per sample: the candidates with the smallest random keys
    idx = np.flatnonzero(cand)
    keyed = idx[np.lexsort((rng.random(len(idx)), sid[idx]))]  # by sample, then by key
    start = np.concatenate(([0], np.cumsum(per)[:-1])) if n else np.zeros(0, np.int64)
    rank = np.arange(len(keyed)) - start[sid[keyed]]
    chosen = np.sort(keyed[rank < need[sid[keyed]]])
    labels = np.full(flat.shape, -100, dtype=np.int64)
    labels[chosen] = flat[chosen]
    out = flat.copy()
    kind = rng.integers(0, 10, len(chosen))
    ordinary = np.setdiff1d(np.arange(vocab), sp)
    out[chosen[kind < 8]] = special["mask"]
    out[chosen[kind == 8]] = ordinary[rng.integers(0, len(ordinary), int((kind == 8).sum()))]
    return out.reshape(ids.shape), labels.reshape(ids.shape)


def val_batches(shards, B, T, limit):
    """The validation micro-batches: the split in file order, packed, masked with VAL_SEED; all of them (every
    sequence once, the last micro-batch partial) or the first `limit` (> 0)."""
    rows = list(pack(shards.lengths, np.arange(shards.num_samples), T))
    count = (len(rows) + B - 1) // B
    if limit:
        count = min(count, limit)
    rng = np.random.default_rng(VAL_SEED)
    return [make_batch(shards, rows[j * B:(j + 1) * B], B, T, rng) for j in range(count)]


# ----------------------------------------------------------------------------
# The records (trainer.cu's log_step and log_validation; tools/plot.py's parse_record reads them).
def record(kind, step, fields):
    """One metrics.jsonl line: {"kind":..,"step":..,<fields in order>}, a number that is not finite as null."""
    r = {"kind": kind, "step": step}
    for k, v in fields:
        r[k] = None if isinstance(v, float) and not math.isfinite(v) else v
    return json.dumps(r, separators=(",", ":")) + "\n"


def train_record(step, tokens, epoch, elapsed, loss, lr, grad_norm, tokens_per_s, data_wait_ms):
    return record("train", step, (("tokens", tokens), ("epoch", epoch), ("elapsed_s", elapsed), ("loss", loss),
                                  ("lr", lr), ("grad_norm", grad_norm), ("tokens_per_s", tokens_per_s),
                                  ("mfu", math.nan), ("data_wait_ms", data_wait_ms), ("comm_bytes", 0)))


def val_record(step, tokens, elapsed, loss, accuracy, masked, sequences, split):
    return record("val", step, (("tokens", tokens), ("elapsed_s", elapsed), ("val_loss", loss),
                                ("val_accuracy", accuracy), ("val_masked", masked), ("val_sequences", sequences),
                                ("val_split", split)))


class MetricsLog:
    """--out/metrics.jsonl, a new one; each record appended whole with one write (a reader never sees half of a
    line but the one being written, which plot.py skips)."""

    def __init__(self, path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        except OSError as e:
            raise PeerTrainError(f"{path}: cannot write: {e.strerror}") from None

    def append(self, line):
        data = line.encode()
        try:
            if os.write(self.fd, data) != len(data):
                raise OSError(0, "a short write")
        except OSError as e:
            raise PeerTrainError(f"{self.path}: cannot append: {e.strerror}") from None

    def close(self):
        os.close(self.fd)


def write_json_atomic(path, obj):
    """obj as JSON in path: a temporary file, flushed, then renamed (a reader sees the old file or the new one)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise PeerTrainError(f"{path}: cannot write: {e.strerror}") from None


# ----------------------------------------------------------------------------
# Options.
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="training shards (a glob, as ./trainer --data)")
    p.add_argument("--val", help="validation shards: the validation every --val-every steps")
    p.add_argument("--out", required=True, help="the run's directory (created): metrics.jsonl, run.json")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    p.add_argument("--like", metavar="RUN", help="an mlm.c run directory: --steps, --warmup, --lr, --global-batch "
                   "and --seq from its run.json (flags given here win)")
    p.add_argument("--preset", default=None, help=f"the model's shape, one of {', '.join(PRESETS)} (default bert-base)")
    p.add_argument("--seq", type=int, help="tokens per row T (default 512)")
    p.add_argument("--global-batch", type=int, help="rows per optimizer step (default --batch)")
    p.add_argument("--batch", type=int, help="rows per micro-batch (default the global batch; it must divide it)")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--lr", type=float, help="peak learning rate (default 5e-4)")
    p.add_argument("--warmup", type=int, help="warmup steps (default 1%% of --steps)")
    p.add_argument("--wd", type=float, default=0.01, help="AdamW's weight decay (not on biases and LayerNorm)")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.98)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--clip", type=float, default=1.0, help="the gradient norm is clipped to X (0: no clipping)")
    p.add_argument("--seed", type=int, default=1337, help="data order, masking and initialisation")
    p.add_argument("--log-every", type=int, default=1, help="a log line (and metrics record) every N steps")
    p.add_argument("--val-every", type=int, default=0, help="validation every N steps and at the last (0: none)")
    p.add_argument("--val-batches", type=int, default=0, help="only the first N validation micro-batches (0: all)")
    p.add_argument("--max-bad-steps", type=int, default=3, help="non-finite steps in a row that stop the run")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: CUDA when torch sees it")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = p.parse_args(argv)
    if a.like:
        path = os.path.join(a.like, "run.json")
        try:
            with open(path, "rb") as f:
                like = json.loads(f.read())
            given = {"steps": like["steps"], "warmup": like["warmup"], "lr": like["lr"],
                     "global_batch": like["global_batch"], "seq": like["seq"]}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PeerTrainError(f"--like {a.like}: cannot read the run's schedule from {path} "
                                 f"({type(e).__name__}: {e}; expected the run.json ./trainer writes)") from None
        for k, v in given.items():
            if getattr(a, k) is None:
                setattr(a, k, v)
        if a.preset is None and isinstance(like.get("preset"), str):
            a.preset = like["preset"]
    a.preset = a.preset or "bert-base"
    a.seq = a.seq or 512
    a.lr = 5e-4 if a.lr is None else a.lr
    if a.preset not in PRESETS:
        raise PeerTrainError(f"--preset {a.preset}: unknown; one of {', '.join(PRESETS)}")
    if a.steps is None:
        raise PeerTrainError("--steps: missing (expected a number of steps >= 1, or --like RUN)")
    if a.steps < 1:
        raise PeerTrainError(f"--steps {a.steps}: expected a number of steps >= 1")
    if a.warmup is None:
        a.warmup = default_warmup(a.steps)
    if not 0 <= a.warmup < a.steps:
        raise PeerTrainError(f"--warmup {a.warmup}: expected 0 <= warmup < --steps {a.steps}")
    a.global_batch = a.global_batch or a.batch
    a.batch = a.batch or a.global_batch
    if not a.batch or a.batch < 1 or a.global_batch < 1 or a.global_batch % a.batch:
        raise PeerTrainError(f"--global-batch {a.global_batch} --batch {a.batch}: expected rows >= 1, the global batch"
                             f" a multiple of --batch")
    P = PRESETS[a.preset][5]
    if not 2 <= a.seq <= P:
        raise PeerTrainError(f"--seq {a.seq}: expected 2..{P} ({a.preset}'s positions)")
    for flag, v, lo, hi in (("--lr", a.lr, 0, 1), ("--wd", a.wd, 0, 1), ("--beta1", a.beta1, 0, 0.999999),
                            ("--beta2", a.beta2, 0, 0.999999), ("--eps", a.eps, 1e-30, 1), ("--clip", a.clip, 0, 1e30)):
        if not lo <= v <= hi:
            raise PeerTrainError(f"{flag} {v}: expected a number in [{lo:g}, {hi:g}]")
    for flag, v in (("--log-every", a.log_every), ("--max-bad-steps", a.max_bad_steps)):
        if v < 1:
            raise PeerTrainError(f"{flag} {v}: expected at least 1")
    for flag, v in (("--val-every", a.val_every), ("--val-batches", a.val_batches)):
        if v < 0:
            raise PeerTrainError(f"{flag} {v}: expected 0 or more")
    if a.val_every and not a.val:
        raise PeerTrainError(f"--val-every {a.val_every}: needs --val GLOB")
    return a


def prepare_out(out, overwrite):
    """--out created; a run already there (metrics.jsonl or run.json) refused without --overwrite."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise PeerTrainError(f"--out {out}: exists and is not a directory")
    old = [f for f in ("metrics.jsonl", "run.json") if os.path.exists(os.path.join(out, f))]
    if old and not overwrite:
        raise PeerTrainError(f"--out {out}: holds a run ({', '.join(old)}); give --overwrite to replace it, or "
                             f"another --out")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise PeerTrainError(f"--out {out}: cannot create the directory: {e.strerror}") from None


# ----------------------------------------------------------------------------
# Training (needs torch and transformers).
def load_torch():
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(f"needs PyTorch and transformers (pip install torch transformers): {e}", 2)
    return torch, transformers


def attention_mask(torch, lo, hi, major, dtype):
    """compare_hf.packed_attention_mask's mask, made by torch on the device of lo and hi (B, T) (a dense (B, T, T)
    mask made on the host and copied would cost as much as a step's compute): token (b, i) sees key j iff
    lo[b, i] <= j < hi[b, i]. transformers 4.x: (B, T, T) int64, 1 allowed; 5.x: (B, 1, T, T) additive, 0 allowed,
    the dtype's minimum not."""
    j = torch.arange(lo.shape[1], device=lo.device)[None, None, :]
    allowed = (j >= lo[:, :, None]) & (j < hi[:, :, None])
    if major < 5:
        return allowed.long()
    additive = torch.zeros(allowed.shape, dtype=dtype, device=lo.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


class Peer:
    """The model, its optimizer, and the steps (torch)."""

    def __init__(self, torch, transformers, a, shards, device):
        self.torch, self.device, self.T = torch, device, a.seq
        self.major = int(transformers.__version__.split(".")[0])
        torch.manual_seed(a.seed)
        cfg = bert_config(transformers, a.preset, vocab=shards.vocab_size, pad_id=shards.special["pad"])
        try:
            model, self.attn = new_model(transformers, cfg, eager_fallback=device == "cpu")
        except PeerError as e:
            fail(str(e))
        self.model = model.to(device).train()
        if a.compile and not hasattr(torch, "compile"):
            fail(f"--compile: torch {torch.__version__} has no torch.compile (it came with torch 2.0)")
        self.fwd = torch.compile(self.model) if a.compile else self.model
        self.params = sum(p.numel() for p in self.model.parameters())
        decay = [p for p in self.model.parameters() if p.dim() >= 2]  # matrices and embeddings
        rest = [p for p in self.model.parameters() if p.dim() < 2]  # biases and LayerNorm
        extra = {"fused": True} if device == "cuda" else {}
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                                     lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, **extra)
        self.autocast = device == "cuda"

    def tensors(self, batch):
        """The micro-batch on the device: input ids, attention mask (attention_mask), position ids, labels."""
        torch, dev = self.torch, self.device
        ids, position, labels, lo, hi = (torch.from_numpy(batch[k]).to(dev, non_blocking=True)
                                         for k in ("ids", "position", "labels", "lo", "hi"))
        dtype = torch.bfloat16 if self.autocast else torch.float32  # 5.x uses the mask as is: the attention's dtype
        return ids, attention_mask(torch, lo, hi, self.major, dtype), position, labels

    def loss_sum(self, batch):
        """(the summed cross-entropy over the masked tokens, the logits of the masked rows, their labels)."""
        torch = self.torch
        ids, mask, position, labels = self.tensors(batch)
        with torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext():
            logits = self.fwd(input_ids=ids, attention_mask=mask, position_ids=position).logits
        sel = labels >= 0
        rows, want = logits[sel].float(), labels[sel]
        return torch.nn.functional.cross_entropy(rows, want, reduction="sum"), rows, want

    def step(self, batches, lr, clip):
        """One optimizer step over the micro-batches: (loss per masked token, gradient norm before clipping, the
        update was made). A loss or norm that is not finite skips the update (the trainer's rule). One host sync."""
        torch = self.torch
        total, count = 0.0, sum(b["masked"] for b in batches)
        for b in batches:
            s, _, _ = self.loss_sum(b)
            (s / (max(b["masked"], 1) * len(batches))).backward()
            total = total + s.detach()
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        loss, norm = (float(x) for x in torch.stack([total / max(count, 1), norm.float()]).tolist())
        ok = math.isfinite(loss) and math.isfinite(norm)
        if ok:
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss, norm, ok

    def evaluate(self, batches):
        """(loss, accuracy) per masked token, masked tokens, sequences over the validation micro-batches."""
        torch = self.torch
        self.model.eval()
        loss, hits, masked, seqs = 0.0, 0, 0, 0
        with torch.no_grad():
            for b in batches:
                s, rows, want = self.loss_sum(b)
                loss += s.item()
                hits += int((rows.argmax(dim=-1) == want).sum().item())
                masked += b["masked"]
                seqs += b["samples"]
        self.model.train()
        return (loss / masked if masked else math.nan, hits / masked if masked else math.nan, masked, seqs)


def fmt_duration(s):
    """42s, 12m05s, 3h07m (the trainer's fmt_duration)."""
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s) // 60}m{int(s) % 60:02d}s"
    return f"{int(s) // 3600}h{int(s) % 3600 // 60:02d}m"


def prefetch(items, depth=2):
    """items (an iterator) made ahead in a thread, up to depth of them, as the trainer's loader threads make batches
    while the device computes; an exception in the thread is raised here, at the item it stopped at."""
    q = queue.Queue(maxsize=depth)

    def work():
        try:
            for it in items:
                q.put((it, None))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            q.put((None, e))

    threading.Thread(target=work, daemon=True).start()
    while True:
        it, err = q.get()
        if err is not None:
            raise err
        yield it


def step_batches(train, a, accum):
    """The training steps' micro-batches, one list of accum per step, and the epoch its last row came from."""
    rows = train_rows(train, a.seq, a.seed)
    rng = np.random.default_rng([a.seed, 1])
    while True:
        batches = []
        for _ in range(accum):
            chunk = [next(rows) for _ in range(a.batch)]
            batches.append(make_batch(train, [r for _, r in chunk], a.batch, a.seq, rng))
        yield batches, chunk[-1][0]


def main(argv=None):
    t_start = time.monotonic()
    try:
        a = parse_args(argv)
        prepare_out(a.out, a.overwrite)
        train = Shards(a.data, "--data")
        val = Shards(a.val, "--val") if a.val else None
        for s, flag in ((train, "--data"), (val, "--val")):
            if s is not None and s.max_len > a.seq:
                raise PeerTrainError(f"{flag} {s.pattern}: samples of up to {s.max_len} tokens do not fit rows of "
                                     f"T={a.seq} (prepare it with --seq-len {a.seq})")
        if val is not None and (val.vocab_size, val.special) != (train.vocab_size, train.special):
            raise PeerTrainError(f"--val {a.val}: another vocabulary than --data {a.data} (expected the same)")
    except PeerTrainError as e:
        fail(str(e))
    torch, transformers = load_torch()
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        fail(f"--device cuda: torch {torch.__version__} sees no CUDA GPU")
    peer = Peer(torch, transformers, a, train, device)
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    accum = a.global_batch // a.batch
    run = {"steps": a.steps, "warmup": a.warmup, "lr": a.lr, "global_batch": a.global_batch, "world": 1,
           "grad_accum": accum, "batch": a.batch, "seq": a.seq, "trainer": "peer_train.py", "preset": a.preset,
           "data": a.data, "val": a.val, "vocab_size": train.vocab_size, "device": dev_name, "attention": peer.attn,
           "torch": torch.__version__, "transformers": transformers.__version__, "seed": a.seed}
    try:
        write_json_atomic(os.path.join(a.out, "run.json"), run)
        log = MetricsLog(os.path.join(a.out, "metrics.jsonl"))
    except PeerTrainError as e:
        fail(str(e))
    print(f"peer: HF BertForMaskedLM {a.preset} ({peer.params:,} parameters, V={train.vocab_size}, attention "
          f"{peer.attn}) on {dev_name}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{train.num_samples:,} samples, {train.num_tokens:,} tokens; T={a.seq}, global batch {a.global_batch} "
          f"({accum} x {a.batch}), {a.steps} steps", flush=True)
    vbatches = val_batches(val, a.batch, a.seq, a.val_batches) if val is not None and a.val_every else []
    steps = prefetch(step_batches(train, a, accum))
    tokens, bad, t_loop = 0, 0, time.monotonic()
    try:
        for step in range(1, a.steps + 1):
            t0 = time.monotonic()
            batches, epoch_now = next(steps)
            wait_ms = 1e3 * (time.monotonic() - t0)
            lr = lr_at(step, a.steps, a.warmup, a.lr)
            loss, norm, ok = peer.step(batches, lr, a.clip)
            now = time.monotonic()
            step_tokens = sum(b["tokens"] for b in batches)
            tokens += step_tokens
            bad = 0 if ok else bad + 1
            if not ok:
                print(f"peer_train.py: step {step}: loss {loss:g}, gradient norm {norm:g}: not finite; update skipped "
                      f"({bad} in a row)", file=sys.stderr)
            if step % a.log_every == 0 or step == 1 or step == a.steps:
                elapsed, dt = now - t_start, now - t0
                eta = (now - t_loop) / step * (a.steps - step)
                print(f"step {step:6d}/{a.steps} | loss {loss:.4f} | lr {lr:.3e} | norm {norm:.3f} | "
                      f"{dt * 1e3:.0f} ms | {step_tokens / dt:.0f} tok/s | data {wait_ms:.1f} ms | epoch {epoch_now} | "
                      f"elapsed {fmt_duration(elapsed)} | ETA {fmt_duration(eta)}", flush=True)
                log.append(train_record(step, tokens, tokens / train.num_tokens, elapsed, loss, lr, norm,
                                        step_tokens / dt, wait_ms))
            if bad >= a.max_bad_steps:
                fail(f"step {step}: {bad} steps in a row with a loss or gradient norm that is not finite: diverged", 2)
            if vbatches and a.val_every and (step % a.val_every == 0 or step == a.steps):
                vl, acc, masked, seqs = peer.evaluate(vbatches)
                print(f"step {step:6d} | val loss {vl:.4f} | accuracy {acc:.4f} | {masked} masked tokens in {seqs} "
                      f"sequences ({'all' if seqs == val.num_samples else seqs} of {val.num_samples})", flush=True)
                log.append(val_record(step, tokens, time.monotonic() - t_start, vl, acc, masked, seqs,
                                      val.num_samples))
    except PeerTrainError as e:
        fail(str(e))
    log.close()
    print(f"peer_train.py: {a.steps} steps, {tokens:,} tokens in {fmt_duration(time.monotonic() - t_start)}; "
          f"wrote {os.path.join(a.out, 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
