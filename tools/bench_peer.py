#!/usr/bin/env python3
"""bench_peer.py: the peer mlm.c is measured against: Hugging Face BertForMaskedLM in PyTorch, as a user
would train it instead, on the same model shapes as ./trainer --bench.

The peer's configuration (bert_config, new_model; tools/peer_train.py trains the same model on shards):
BertForMaskedLM with the preset's shape and vocabulary, the tanh form of GELU (hidden_act
"gelu_pytorch_tanh", as mlm.c's model), attn_implementation "sdpa", fp32 weights under bf16 autocast,
fused AdamW (lr 1e-4, betas 0.9/0.98, eps 1e-6, weight decay 0.01) with gradient clipping at 1.0 (mlm.c's
defaults), dropout 0 (mlm.c has none), full rows of T random ordinary tokens (no padding, no attention
mask), 15% of positions masked ([MASK]) and predicted.
It finds its largest micro-batch (a training step at doubling sizes until one runs out of memory, then
bisection, the CUDA cache cleared between tries), times steps at powers of two up to that and at the
largest itself, and reports the best.

    python3 tools/bench_peer.py                       # bert-base and bert-large, T=512
    python3 tools/bench_peer.py --preset bert-base --seq 128 --batch 64,128 --steps 20

Prints a table per preset and one machine-readable line
    peer-result preset=P T=512 batch=B max_batch=B tokens_per_s=X step_ms=X device="..." ...
Needs a CUDA GPU, torch and transformers; without them it says so in one line and exits with 2.
"""
import argparse
import gc
import sys
import time

# The shapes of model.h's presets: (vocab, layers, hidden, heads, intermediate, positions).
PRESETS = {
    "tiny": (211, 2, 32, 2, 64, 40),
    "mini": (260, 2, 128, 2, 512, 512),
    "bert-base": (30522, 12, 768, 12, 3072, 512),
    "bert-large": (30522, 24, 1024, 16, 4096, 512),
    "paper-120m": (50304, 12, 768, 12, 3072, 512),
    "paper-350m": (50304, 24, 1024, 16, 4096, 512),
}
NUM_SPECIAL = 5  # ids 0..4 are special, as in ./trainer --bench's synthetic data; [MASK] is 4
MASK_ID = 4
PEER_CONFIG = ("HF BertForMaskedLM, tanh GELU, sdpa attention, bf16 autocast over fp32 weights, fused AdamW, "
               "clip 1.0, dropout 0, full rows of random tokens, 15% masked")


class PeerError(Exception):
    """Why the peer cannot be built, in one line (each tool prints it with its own name)."""


def bert_config(transformers, preset, vocab=None, pad_id=0):
    """The peer's BertConfig: model.h's preset shape (vocab: the shards' vocabulary instead of the preset's),
    the tanh form of GELU, dropout 0 (mlm.c has none), LayerNorm eps 1e-12, the decoder tied to the embeddings."""
    V, L, C, NH, I, P = PRESETS[preset]
    return transformers.BertConfig(vocab_size=vocab or V, hidden_size=C, num_hidden_layers=L, num_attention_heads=NH,
                                   intermediate_size=I, max_position_embeddings=P, type_vocab_size=2,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-12, pad_token_id=pad_id,
                                   tie_word_embeddings=True)


def new_model(transformers, cfg, eager_fallback=False):
    """BertForMaskedLM(cfg) with attn_implementation "sdpa", and the attention it got. With eager_fallback, "eager"
    where this torch has no SDPA for transformers (torch < 2.1.1 under transformers 4.x); else PeerError."""
    try:  # transformers 4.36+ and 5.x
        model = transformers.BertForMaskedLM._from_config(cfg, attn_implementation="sdpa")
    except TypeError:  # older: no such argument
        cfg._attn_implementation = "sdpa"
        model = transformers.BertForMaskedLM(cfg)
    except (ImportError, ValueError) as e:  # this torch has no SDPA (transformers says why)
        if not eager_fallback:
            raise PeerError(f"transformers {transformers.__version__} cannot use sdpa attention: "
                            f"{str(e).strip().splitlines()[0]}") from None
        model = transformers.BertForMaskedLM._from_config(cfg, attn_implementation="eager")
    attn = getattr(model.config, "_attn_implementation", "?")
    if attn != "sdpa" and not (eager_fallback and attn == "eager"):
        raise PeerError(f"transformers {transformers.__version__} gave attention '{attn}', not sdpa")
    return model, attn


def fail(msg):
    print(f"bench_peer.py: {msg}", file=sys.stderr)
    sys.exit(2)


def find_largest(fits, start=8, cap=1 << 16):
    """The largest B in [1, cap] with fits(B), assuming fits is monotone: doubling from start until a size
    fails, then bisection between the last size that fit and the first that did not. 0 if not even 1 fits."""
    lo, hi = 0, start
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    if hi > cap:
        if lo == cap or fits(cap):
            return cap
        hi = cap
    if lo == 0 and hi > 1:  # start itself failed: search [1, start)
        if not fits(1):
            return 0
        lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def candidates(max_b):
    """Micro-batches to time: powers of two from max_b / 16 up to max_b, and max_b itself."""
    out, b = [], 1
    while b <= max_b:
        if b * 16 >= max_b:
            out.append(b)
        b *= 2
    if max_b and max_b not in out:
        out.append(max_b)
    return out


def load_peer():
    """torch and transformers, and a usable CUDA device, or a one-line error."""
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(f"needs PyTorch and transformers (pip install torch transformers): {e}")
    if not torch.cuda.is_available():
        fail(f"needs a CUDA GPU: torch {torch.__version__} sees none")
    return torch, transformers


class Peer:
    def __init__(self, torch, transformers, preset, T, compile_model):
        V, L, C, NH, I, P = PRESETS[preset]
        if T > P:
            fail(f"--seq {T} is longer than {preset}'s {P} positions")
        self.torch, self.V, self.T = torch, V, T
        torch.manual_seed(0)
        try:
            model, self.attn = new_model(transformers, bert_config(transformers, preset))
        except PeerError as e:
            fail(str(e))
        self.model = model.cuda().train()
        self.params = sum(p.numel() for p in self.model.parameters())
        self.fwd = torch.compile(self.model) if compile_model else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6,
                                     weight_decay=0.01, fused=True)

    def batch(self, B):
        torch = self.torch
        ids = torch.randint(NUM_SPECIAL, self.V, (B, self.T), device="cuda")
        masked = torch.rand(B, self.T, device="cuda") < 0.15
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        return ids.masked_fill(masked, MASK_ID), labels

    def step(self, ids, labels):
        torch = self.torch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.fwd(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def clear(self):
        self.opt.zero_grad(set_to_none=True)
        gc.collect()
        self.torch.cuda.empty_cache()

    def fits(self, B):
        torch = self.torch
        try:
            ids, labels = self.batch(B)
            self.step(ids, labels)
            torch.cuda.synchronize()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            ids = labels = None
            self.clear()

    def time(self, B, warmup, steps):
        """(ms per step, tokens/s, peak GiB) at micro-batch B, or None when it runs out of memory."""
        torch = self.torch
        try:
            ids, labels = self.batch(B)
            for _ in range(warmup):
                self.step(ids, labels)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = self.step(ids, labels)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / steps
            if not torch.isfinite(loss):
                fail(f"B={B}: the loss is {loss.item()}")
            return dt * 1e3, B * self.T / dt, torch.cuda.max_memory_allocated() / 2**30
        except torch.cuda.OutOfMemoryError:
            return None
        finally:
            ids = labels = None
            self.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="bert-base,bert-large", help="comma-separated presets (model.h's)")
    ap.add_argument("--seq", type=int, default=512, help="tokens per row (T)")
    ap.add_argument("--batch", default="", help="comma-separated micro-batches to time (default: see above)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per micro-batch")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--check", action="store_true", help="only check that torch, transformers and a GPU are there")
    a = ap.parse_args()
    presets = [p for p in a.preset.split(",") if p]
    for p in presets:
        if p not in PRESETS:
            fail(f"--preset {p}: unknown; one of {', '.join(PRESETS)}")
    if a.seq < 2 or a.steps < 1 or a.warmup < 0:
        fail(f"--seq {a.seq} --steps {a.steps} --warmup {a.warmup}: expected T >= 2, steps >= 1, warmup >= 0")
    try:
        batches = [int(b) for b in a.batch.split(",") if b]
    except ValueError:
        fail(f"--batch {a.batch}: expected comma-separated positive integers")
    if any(b < 1 for b in batches):
        fail(f"--batch {a.batch}: expected comma-separated positive integers")
    torch, transformers = load_peer()
    device = torch.cuda.get_device_name()
    if a.check:
        print(f"bench_peer.py: torch {torch.__version__}, transformers {transformers.__version__}, {device}")
        return 0
    print(f"peer: {PEER_CONFIG}; torch {torch.__version__}, transformers {transformers.__version__}, {device}")
    for preset in presets:
        peer = Peer(torch, transformers, preset, a.seq, a.compile)
        max_b = find_largest(peer.fits)
        if max_b == 0:
            fail(f"{preset}: not even one row of {a.seq} tokens fits on {device}")
        rows = []
        for B in batches or candidates(max_b):
            r = peer.time(B, a.warmup, a.steps)
            rows.append((B, r))
        done = [(B, r) for B, r in rows if r]
        if not done:
            fail(f"{preset}: every micro-batch ran out of memory")
        best_b, best = max(done, key=lambda x: x[1][1])
        print(f"peer {preset}: T={a.seq}, V={peer.V}, {peer.params:,} parameters, attention {peer.attn}"
              f"{', torch.compile' if a.compile else ''}; largest micro-batch {max_b}")
        print(f"  {'micro-batch':>11} {'ms/step':>10} {'tokens/s':>12} {'peak GiB':>9}")
        for B, r in rows:
            if r:
                print(f"  {B:>11} {r[0]:>10.1f} {r[1]:>12,.0f} {r[2]:>9.1f}")
            else:
                print(f"  {B:>11} {'out of memory':>33}")
        print(f'peer-result preset={preset} T={a.seq} batch={best_b} max_batch={max_b} tokens_per_s={best[1]:.0f} '
              f'step_ms={best[0]:.3f} compile={int(a.compile)} device="{device}" torch={torch.__version__} '
              f'transformers={transformers.__version__}', flush=True)
        del peer
        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
