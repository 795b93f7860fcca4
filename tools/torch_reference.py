#!/usr/bin/env python3
"""torch_reference.py: the independent reference for tests/test_model.cu.

Builds the `tiny` BERT masked-language model (model.h's preset) in plain PyTorch, written out layer
by layer from the BERT paper and Hugging Face's BertForMaskedLM (post-LayerNorm, GELU's tanh form as
cuBLASLt's epilogues compute it, decoder tied to the word embeddings with its own bias), on one fixed
batch with packed rows and padding, and computes in float64 with autograd:
  the loss (mean cross-entropy over the masked positions), the logits of the masked rows, and the
  gradient of the loss with respect to every parameter.
Writes tests/data/tiny_reference.safetensors (float32 / int32 tensors):
  <HF parameter name>          the parameters (deterministic: torch.manual_seed(1234))
  grad/<HF parameter name>     their gradients
  input/tokens, input/types, input/seg_lo, input/seg_hi   (B, T) int32
  input/mlm_pos, input/mlm_labels                         (M) int32; pos indexes the flattened (B*T)
  out/loss (1), out/logits (M, V)
  bf16err/loss, bf16err/logits, bf16err/<name>  (1) relative (L2) errors of the same model with bf16 storage
                               emulated (see main): the scale of error a correct bf16 implementation has

Attention: token i of row b attends to keys j with seg_lo[b,i] <= j < seg_hi[b,i] (its own sample
in a packed row); padding tokens have seg_lo == seg_hi (they attend to nothing). Position ids restart
at every sample: pos = i - seg_lo[b,i].

Regenerate (needs PyTorch; Debian's python3-torch works):  /usr/bin/python3 tools/torch_reference.py
"""
import json, os, struct, sys
import torch

V, P, C, L, NH, I, EPS = 211, 40, 32, 2, 2, 64, 1e-12   # model.h "tiny"
B, T = 3, 24
HD = C // NH


def param_shapes():
    s = [("bert.embeddings.word_embeddings.weight", (V, C)),
         ("bert.embeddings.position_embeddings.weight", (P, C)),
         ("bert.embeddings.token_type_embeddings.weight", (2, C)),
         ("bert.embeddings.LayerNorm.weight", (C,)), ("bert.embeddings.LayerNorm.bias", (C,))]
    for l in range(L):
        p = f"bert.encoder.layer.{l}."
        s += [(p + "attention.self.query.weight", (C, C)), (p + "attention.self.query.bias", (C,)),
              (p + "attention.self.key.weight", (C, C)), (p + "attention.self.key.bias", (C,)),
              (p + "attention.self.value.weight", (C, C)), (p + "attention.self.value.bias", (C,)),
              (p + "attention.output.dense.weight", (C, C)), (p + "attention.output.dense.bias", (C,)),
              (p + "attention.output.LayerNorm.weight", (C,)), (p + "attention.output.LayerNorm.bias", (C,)),
              (p + "intermediate.dense.weight", (I, C)), (p + "intermediate.dense.bias", (I,)),
              (p + "output.dense.weight", (C, I)), (p + "output.dense.bias", (C,)),
              (p + "output.LayerNorm.weight", (C,)), (p + "output.LayerNorm.bias", (C,))]
    s += [("cls.predictions.transform.dense.weight", (C, C)), ("cls.predictions.transform.dense.bias", (C,)),
          ("cls.predictions.transform.LayerNorm.weight", (C,)), ("cls.predictions.transform.LayerNorm.bias", (C,)),
          ("cls.predictions.bias", (V,))]
    return s


def make_params(g):
    """Larger than BERT's 0.02 init so every nonlinearity is exercised (LayerNorm weights near 1)."""
    ps = {}
    for name, shape in param_shapes():
        if name.endswith("LayerNorm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif len(shape) == 2:
            t = 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            t = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        ps[name] = t.float().double()  # representable in float32: the C side starts from the same values
    return ps


def make_batch(g):
    # row 0: samples of 10 and 9 tokens, then 5 padding; row 1: one sample of 24;
    # row 2: a sample of 1 token, one of 7, then 16 padding
    rows = [[10, 9], [24], [1, 7]]
    tokens = torch.zeros(B, T, dtype=torch.int64)
    types = torch.zeros(B, T, dtype=torch.int64)
    lo = torch.zeros(B, T, dtype=torch.int64)
    hi = torch.zeros(B, T, dtype=torch.int64)
    for b, lens in enumerate(rows):
        s = 0
        for n in lens:
            tokens[b, s:s + n] = torch.randint(1, V, (n,), generator=g)
            cut = int(torch.randint(0, n + 1, (1,), generator=g))  # sentence A then sentence B
            types[b, s + cut:s + n] = 1
            lo[b, s:s + n] = s
            hi[b, s:s + n] = s + n
            s += n
    real = [b * T + t for b in range(B) for t in range(T) if hi[b, t] > lo[b, t]]
    pick = torch.randperm(len(real), generator=g)[:9].sort().values
    pos = [real[i] for i in pick.tolist()]
    if 2 * T not in pos:  # the 1-token sample of row 2 is always masked
        pos = sorted(pos[:-1] + [2 * T])
    labels = torch.randint(0, V, (len(pos),), generator=g)
    return tokens, types, lo, hi, torch.tensor(pos, dtype=torch.int64), labels


def layernorm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + EPS) * w + b


def gelu(x):  # the tanh form (Hugging Face's "gelu_pytorch_tanh"), as model.h computes it
    return 0.5 * x * (1.0 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))


class RoundBF16(torch.autograd.Function):
    """Rounds to bf16 in the forward and rounds the gradient to bf16 in the backward: a stored bf16 tensor."""
    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


def no_round(x):
    return x


def forward(ps, tokens, types, lo, hi, pos, labels, R=no_round):
    """R marks where the C model stores a floatX tensor; R = RoundBF16.apply emulates bf16 storage."""
    t_idx = torch.arange(T).expand(B, T)
    real = hi > lo
    position = torch.where(real, t_idx - lo, torch.zeros_like(lo))
    x = (ps["bert.embeddings.word_embeddings.weight"][tokens] + ps["bert.embeddings.position_embeddings.weight"][position]
         + ps["bert.embeddings.token_type_embeddings.weight"][types])
    x = R(layernorm(x, ps["bert.embeddings.LayerNorm.weight"], ps["bert.embeddings.LayerNorm.bias"]))
    j = torch.arange(T).view(1, 1, T)
    allowed = (j >= lo.unsqueeze(-1)) & (j < hi.unsqueeze(-1))  # (B, Tq, Tk)
    allowed = allowed.unsqueeze(1)  # (B, 1, Tq, Tk)
    lin = lambda x, n: x @ ps[n + ".weight"].T + ps[n + ".bias"]
    for l in range(L):
        p = f"bert.encoder.layer.{l}."
        q = R(lin(x, p + "attention.self.query")).view(B, T, NH, HD).transpose(1, 2)
        k = R(lin(x, p + "attention.self.key")).view(B, T, NH, HD).transpose(1, 2)
        v = R(lin(x, p + "attention.self.value")).view(B, T, NH, HD).transpose(1, 2)
        s = (q @ k.transpose(-1, -2)) / HD ** 0.5
        s = s.masked_fill(~allowed, -1e30)
        a = R(torch.softmax(s, -1) * allowed)  # padding queries: all masked, output 0 (as the C model)
        y = R((a @ v).transpose(1, 2).reshape(B, T, C))
        x = R(x + R(lin(y, p + "attention.output.dense")))
        x = R(layernorm(x, ps[p + "attention.output.LayerNorm.weight"], ps[p + "attention.output.LayerNorm.bias"]))
        hpre = R(lin(x, p + "intermediate.dense"))
        h = R(gelu(hpre))
        x = R(x + R(lin(h, p + "output.dense")))
        x = R(layernorm(x, ps[p + "output.LayerNorm.weight"], ps[p + "output.LayerNorm.bias"]))
    hm = x.reshape(B * T, C)[pos]
    hm = R(gelu(R(lin(hm, "cls.predictions.transform.dense"))))
    hm = R(layernorm(hm, ps["cls.predictions.transform.LayerNorm.weight"], ps["cls.predictions.transform.LayerNorm.bias"]))
    logits = R(hm @ ps["bert.embeddings.word_embeddings.weight"].T + ps["cls.predictions.bias"])
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return loss, logits


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for r in blobs:
            f.write(r)


def main():
    g = torch.Generator().manual_seed(1234)
    ps = make_params(g)
    tokens, types, lo, hi, pos, labels = make_batch(g)
    for t in ps.values():
        t.requires_grad_(True)
    loss, logits = forward(ps, tokens, types, lo, hi, pos, labels)
    loss.backward()
    # the same model with bf16 storage emulated (weights and every stored activation and gradient rounded
    # to bf16, arithmetic in float64): how far an honest bf16 implementation lands from the exact result.
    # Its relative L2 errors set the C test's bf16 tolerances (bf16err/...).
    pb = {n: RoundBF16.apply(t.detach()).requires_grad_(True) for n, t in ps.items()}
    loss_b, logits_b = forward(pb, tokens, types, lo, hi, pos, labels, R=RoundBF16.apply)
    loss_b.backward()
    rel = lambda a, b: (torch.linalg.norm(a - b) / torch.linalg.norm(b).clamp_min(1e-30)).float().reshape(1)
    out = {}
    out["bf16err/loss"] = ((loss_b - loss).abs() / loss.abs()).detach().float().reshape(1)
    out["bf16err/logits"] = rel(logits_b.detach(), logits.detach())
    for name, _ in param_shapes():
        out["bf16err/" + name] = rel(pb[name].grad, ps[name].grad)
    for name, _ in param_shapes():
        out[name] = ps[name].detach().float()
    for name, _ in param_shapes():
        out["grad/" + name] = ps[name].grad.float()
    i32 = lambda t: t.to(torch.int32)
    out.update({"input/tokens": i32(tokens), "input/types": i32(types), "input/seg_lo": i32(lo), "input/seg_hi": i32(hi),
                "input/mlm_pos": i32(pos), "input/mlm_labels": i32(labels),
                "out/loss": loss.detach().float().reshape(1), "out/logits": logits.detach().float()})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny_reference.safetensors")
    write_safetensors(path, out)
    worst = max((out["bf16err/" + n].item(), n) for n, _ in param_shapes())
    print(f"emulated bf16: loss error {out['bf16err/loss'].item():.2e}, logits {out['bf16err/logits'].item():.2e}, "
          f"worst gradient {worst[0]:.2e} ({worst[1]})")
    print(f"loss {loss.item():.6f}, {len(pos)} masked rows, wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    sys.exit(main())
