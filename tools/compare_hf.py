#!/usr/bin/env python3
"""compare_hf.py: loads our Hugging Face export with `transformers` and compares its masked-row logits
with the ones our model computed on the same batch. Not part of CI (needs PyTorch and transformers).

  MLM_EXPORT_DIR=/tmp/mlm_export build/test_model_fp32     # writes model.safetensors, config.json,
                                                           # batch_and_logits.bin (batch + our logits)
  python3 tools/compare_hf.py /tmp/mlm_export
  MLM_IMPORT_DIR=/tmp/mlm_export/hf_saved build/test_model_fp32   # reads transformers' own save back

The export is loaded with BertForMaskedLM.from_pretrained (so names, shapes, the tied decoder and the
config must all be what transformers expects), with eager attention. Packed rows are given to it as an
attention mask in which token i sees key j iff both are in the same sample, and position ids that restart
at each sample. transformers 4.x takes that mask as 3-D (B, T, T) of 1/0; 5.x rejects a 3-D mask and takes
a 4-D additive float mask (B, 1, T, T): 0 where allowed, the float32 minimum elsewhere (packed_attention_mask).
Padding tokens see nothing and are not compared (only masked rows are).
"""
import os, struct, sys
import numpy as np


def packed_attention_mask(lo, hi, transformers_major):
    """The attention mask of packed rows: token (b, i) sees key j iff lo[b, i] <= j < hi[b, i] (its own
    sample; padding has lo == hi and sees nothing). lo, hi: (B, T) int arrays.
    transformers 4.x: (B, T, T) int64, 1 allowed, 0 not (BertModel makes it additive itself).
    transformers 5.x and later: (B, 1, T, T) float32, 0 allowed, np.finfo(np.float32).min not, used as is."""
    T = lo.shape[1]
    j = np.arange(T)[None, None, :]
    allowed = (j >= lo[:, :, None]) & (j < hi[:, :, None])  # (B, T, T)
    if transformers_major < 5:
        return allowed.astype(np.int64)
    return np.where(allowed, np.float32(0), np.finfo(np.float32).min).astype(np.float32)[:, None, :, :]


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/mlm_export"
    if not os.path.isfile(os.path.join(d, "batch_and_logits.bin")):
        print(f"compare_hf.py: {d} has no batch_and_logits.bin: this tool compares the export that "
              f"MLM_EXPORT_DIR={d} build/test_model_fp32 writes (with our logits), not a training run's export "
              f"(try that one with tools/fill_mask.py)", file=sys.stderr)
        return 2
    try:
        import torch
        import transformers
        from transformers import BertForMaskedLM
    except ImportError as e:
        print(f"compare_hf.py: needs PyTorch and transformers (pip install torch transformers): {e}", file=sys.stderr)
        return 2
    raw = open(f"{d}/batch_and_logits.bin", "rb").read()
    B, T, M, V = struct.unpack("<4i", raw[:16])
    a = np.frombuffer(raw, dtype=np.int32, offset=16, count=4 * B * T + M)
    tokens, types, lo, hi = (a[i * B * T:(i + 1) * B * T].reshape(B, T) for i in range(4))
    pos = a[4 * B * T:]
    ours = np.frombuffer(raw, dtype=np.float32, offset=16 + 4 * (4 * B * T + M), count=M * V).reshape(M, V)

    major = int(transformers.__version__.split(".")[0])
    dtype = {"dtype" if major >= 5 else "torch_dtype": torch.float32}  # 5.x renamed the argument
    model = BertForMaskedLM.from_pretrained(d, attn_implementation="eager", **dtype).eval()
    mask = packed_attention_mask(lo, hi, major)
    position = np.where(hi > lo, np.arange(T)[None, :] - lo, 0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long), token_type_ids=torch.tensor(types, dtype=torch.long),
                    attention_mask=torch.tensor(mask), position_ids=torch.tensor(position, dtype=torch.long))
    hf = out.logits.reshape(B * T, -1)[torch.tensor(pos, dtype=torch.long)].numpy()
    err = np.abs(hf - ours).max()
    rel = np.linalg.norm(hf - ours) / np.linalg.norm(hf)
    print(f"{M} masked rows x {V}: max |hf - ours| = {err:.3g} (max |logit| {np.abs(hf).max():.3g}), relative L2 {rel:.3g}")
    ok = rel < 1e-4
    print("OK: transformers reproduces our logits" if ok else "MISMATCH")
    # and the other direction: a checkpoint written by transformers, for test_model's MLM_IMPORT_DIR check
    model.save_pretrained(f"{d}/hf_saved", safe_serialization=True)
    print(f"wrote {d}/hf_saved (transformers' own save); check it with: MLM_IMPORT_DIR={d}/hf_saved build/test_model_fp32")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
