#!/usr/bin/env python3
"""fill_mask.py: what a trained model predicts at masked positions, from its Hugging Face export.

    python3 tools/fill_mask.py runs/a --file /usr/bin/ls --offset 4096 --length 64 --mask-every 8
    python3 tools/fill_mask.py runs/a --file /usr/bin/ls --offset 4096 --length 64 --positions 0,5,9
    python3 tools/fill_mask.py runs/wiki --text "The capital of France is [MASK]." --top 5
    python3 tools/fill_mask.py runs/a --file /usr/bin/ls --length 64 --mask-every 8 --inputs-only

DIR is an export of ./trainer (--out): config.json + model.safetensors (BertForMaskedLM), with the
tokenizer the shards were made with: tokenizer.json (text) or byte_tokenizer.json (bytes: token b is
the byte b, then [PAD] [CLS] [SEP] [MASK]). The input becomes one sample as tools/prepare.py makes
them, [CLS] tokens [SEP] (text: tokenized without special tokens, by the `tokenizers` library from
DIR/tokenizer.json, the tokenizer AutoTokenizer.from_pretrained(DIR) wraps).

What is masked: every "[MASK]" written in --text (either kind of export), --positions I,J,..
(0-based among the input's tokens, [CLS] not counted), or --mask-every K (tokens 0, K, 2K, ...).
--file PATH reads bytes [--offset, --offset + --length) of a file (text exports decode them as UTF-8;
--length defaults to the length the model was trained at less two, tokenizer_config.json's
model_max_length, else to the model's positions less two, and says which). An input longer than the
trained length is said (positions past it were never trained).

The export's tokenizer.json is also what Hugging Face's own classes read: AutoTokenizer.from_pretrained(DIR)
and pipeline("fill-mask", model=DIR) give the same ids (bytes too: the trainer writes a byte-level
tokenizer.json beside byte_tokenizer.json).
For each masked position it prints the token that was there and the --top K predictions with their
probabilities, then how many masked tokens the top prediction got right.

Loading the model needs PyTorch and transformers (python3 -m pip install torch transformers);
--inputs-only prints the masked input without them.
"""
import argparse
import json
import os
import sys

MASK = "[MASK]"
BYTE_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


class FillMaskError(Exception):
    pass


def die(msg):
    print(f"fill_mask.py: {msg}", file=sys.stderr)
    sys.exit(1)


def read_json(path, what):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FillMaskError(f"{path}: no such file ({what})") from None
    except (OSError, ValueError) as e:
        raise FillMaskError(f"{path}: not readable JSON ({e})") from None


def load_byte_tokenizer(path):
    """byte_tokenizer.json: {"type": "bytes", "vocab_size": V, "special_tokens": {"[PAD]": id, ...}} checked,
    as {"vocab_size": V, "[PAD]": id, "[CLS]": id, "[SEP]": id, "[MASK]": id}."""
    t = read_json(path, "the byte vocabulary of a bytes export")
    if not isinstance(t, dict) or t.get("type") != "bytes":
        raise FillMaskError(f'{path}: expected an object with "type": "bytes"')
    v = t.get("vocab_size")
    if isinstance(v, bool) or not isinstance(v, int) or v < 256 + len(BYTE_SPECIALS):
        raise FillMaskError(f'{path}: "vocab_size" is {json.dumps(v)} (expected an integer >= 260: 256 bytes + specials)')
    sp = t.get("special_tokens")
    if not isinstance(sp, dict):
        raise FillMaskError(f'{path}: no "special_tokens" object')
    out = {"vocab_size": v}
    for name in BYTE_SPECIALS:
        i = sp.get(name)
        if isinstance(i, bool) or not isinstance(i, int) or not 256 <= i < v:
            raise FillMaskError(f'{path}: special token {name} is {json.dumps(i)} (expected an id in 256..{v - 1})')
        if i in out.values():
            raise FillMaskError(f"{path}: special token {name} has the id {i} of another")
        out[name] = i
    return out


def split_masks(text):
    """The text's pieces between "[MASK]"s: 'a [MASK] b' -> ['a ', ' b'] (one mask between two pieces)."""
    return text.split(MASK)


def choose_positions(n, positions, mask_every, already):
    """The content positions to mask (0-based, [CLS] not counted), sorted: --positions, --mask-every, or
    the [MASK]s already in the input. Exactly one way; errors name the flag."""
    if positions is not None and mask_every is not None:
        raise FillMaskError("--positions and --mask-every: give one of them")
    if positions is not None:
        bad = [p for p in positions if not 0 <= p < n]
        if bad:
            raise FillMaskError(f"--positions {bad[0]}: outside the input's {n} tokens (0..{n - 1})")
        chosen = sorted(set(positions))
    elif mask_every is not None:
        chosen = list(range(0, n, mask_every))
    else:
        chosen = []
    if chosen and already:
        raise FillMaskError(f"the input has {MASK} already: --positions and --mask-every mask an input without it")
    chosen = chosen or sorted(already)
    if not chosen:
        raise FillMaskError(f"nothing to mask: write {MASK} in --text, or give --positions I,J,.. or --mask-every K")
    return chosen


def masked_sample(content, cls_id, sep_id, mask_id, positions, max_positions):
    """[CLS] content [SEP] with the chosen content positions replaced by [MASK]. Returns the input ids, the
    masked positions in them (content position + 1), and the ids that were there (None where the input
    itself had [MASK])."""
    if len(content) + 2 > max_positions:
        raise FillMaskError(f"the input is {len(content)} tokens; with [CLS] and [SEP] that is more than the "
                            f"model's {max_positions} positions (at most {max_positions - 2} tokens: a shorter "
                            f"--length or --text)")
    ids = [cls_id] + list(content) + [sep_id]
    where, was = [], []
    for p in positions:
        where.append(p + 1)
        was.append(None if content[p] == mask_id else content[p])
        ids[p + 1] = mask_id
    return ids, where, was


def byte_content(data, text, tok):
    """Token ids of raw bytes, or of --text's UTF-8 bytes with each "[MASK]" as the mask id; and the [MASK] positions."""
    if data is not None:
        return list(data), []
    ids, masks = [], []
    pieces = split_masks(text)
    for i, piece in enumerate(pieces):
        ids += list(piece.encode("utf-8"))
        if i < len(pieces) - 1:
            masks.append(len(ids))
            ids.append(tok["[MASK]"])
    return ids, masks


def text_content(tokenizer, text, mask_id):
    """Token ids of the text by the tokenizer (no special tokens added), each "[MASK]" the mask id; and the
    [MASK] positions. The pieces between masks are tokenized apart, so "[MASK]" never depends on
    whether the tokenizer knows it as a special token."""
    ids, masks = [], []
    pieces = split_masks(text)
    for i, piece in enumerate(pieces):
        if piece.strip():
            ids += tokenizer.encode(piece, add_special_tokens=False).ids
        if i < len(pieces) - 1:
            masks.append(len(ids))
            ids.append(mask_id)
    return ids, masks


def load_text_tokenizer(path):
    """DIR/tokenizer.json through `tokenizers`, with its [CLS] [SEP] [MASK] ids."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise FillMaskError(f"needs tokenizers ({e}): python3 -m pip install -r tools/requirements.txt") from None
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions
        raise FillMaskError(f"{path}: not a tokenizer.json ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    ids = {}
    for name in ("[CLS]", "[SEP]", MASK):
        i = tok.token_to_id(name)
        if i is None:
            raise FillMaskError(f"{path}: the vocabulary has no {name} token")
        ids[name] = i
    return tok, ids


def read_window(path, offset, length):
    """Bytes [offset, offset + length) of a file."""
    if offset < 0:
        raise FillMaskError(f"--offset {offset}: expected >= 0")
    if length is not None and length < 1:
        raise FillMaskError(f"--length {length}: expected >= 1")
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length if length is not None else -1)
    except OSError as e:
        raise FillMaskError(f"--file {path}: {e.strerror}") from None
    if not data:
        raise FillMaskError(f"--file {path}: no bytes at --offset {offset} (the file has {os.path.getsize(path)})")
    return data


def trained_length(d):
    """tokenizer_config.json's model_max_length (the trainer writes the --seq it trained at), or None."""
    path = os.path.join(d, "tokenizer_config.json")
    if not os.path.exists(path):
        return None
    c = read_json(path, "the tokenizer's configuration")
    n = c.get("model_max_length") if isinstance(c, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 3 else None


def byte_name(i, tok):
    if i is None:
        return MASK
    if i < 256:
        c = chr(i)
        return f"0x{i:02x} {c!r}" if 32 <= i < 127 else f"0x{i:02x}"
    for name in BYTE_SPECIALS:
        if tok.get(name) == i:
            return name
    return f"id {i}"


def prepare(args):
    """Everything before the model: the export's files and the masked input. Returns a dict."""
    d = args.export
    if not os.path.isdir(d):
        raise FillMaskError(f"{d}: no such directory (expected an export: ./trainer's --out)")
    config = read_json(os.path.join(d, "config.json"), "the model's configuration: is this an export of ./trainer --out?")
    max_pos, vocab = config.get("max_position_embeddings"), config.get("vocab_size")
    if not isinstance(max_pos, int) or not isinstance(vocab, int):
        raise FillMaskError(f"{os.path.join(d, 'config.json')}: no integer max_position_embeddings and vocab_size")
    if args.text is None and args.file is None:
        raise FillMaskError("give --text TEXT or --file PATH")
    if args.top < 1:
        raise FillMaskError(f"--top {args.top}: expected >= 1")
    if args.mask_every is not None and args.mask_every < 1:
        raise FillMaskError(f"--mask-every {args.mask_every}: expected >= 1")
    trained = trained_length(d)
    length = args.length
    if length is None and args.file is not None:  # what fits beside [CLS] and [SEP]
        length = (trained or max_pos) - 2
        why = (f"the model was trained at T={trained} (tokenizer_config.json's model_max_length)" if trained else
               f"the model's {max_pos} positions (no model_max_length in tokenizer_config.json)")
    data = read_window(args.file, args.offset, length) if args.file is not None else None
    if args.length is None and data is not None:
        print(f"note: --length {length} bytes by default: {why}, less [CLS] and [SEP]", file=sys.stderr)
    if data is None and (args.offset or args.length is not None):
        raise FillMaskError("--offset and --length select a window of --file")
    byte_path, text_path = os.path.join(d, "byte_tokenizer.json"), os.path.join(d, "tokenizer.json")
    if os.path.exists(byte_path):
        tok = load_byte_tokenizer(byte_path)
        content, masks = byte_content(data, args.text, tok)
        name = lambda i: byte_name(i, tok)  # noqa: E731
        cls_id, sep_id, mask_id, tv = tok["[CLS]"], tok["[SEP]"], tok[MASK], tok["vocab_size"]
        kind = "bytes"
    elif os.path.exists(text_path):
        tokenizer, ids_of = load_text_tokenizer(text_path)
        text = args.text if data is None else data.decode("utf-8", errors="replace")
        cls_id, sep_id, mask_id, tv = ids_of["[CLS]"], ids_of["[SEP]"], ids_of[MASK], tokenizer.get_vocab_size()
        content, masks = text_content(tokenizer, text, mask_id)
        name = lambda i: MASK if i is None else tokenizer.id_to_token(i)  # noqa: E731
        kind = "text"
    else:
        raise FillMaskError(f"{d}: no tokenizer.json or byte_tokenizer.json (the tokenizer the shards were made with)")
    if tv != vocab:
        raise FillMaskError(f"{d}: the tokenizer has {tv} tokens but config.json's vocab_size is {vocab}")
    if not content:
        raise FillMaskError("the input has no tokens")
    chosen = choose_positions(len(content), args.positions, args.mask_every, masks)
    ids, where, was = masked_sample(content, cls_id, sep_id, mask_id, chosen, max_pos)
    if trained and len(ids) > trained:
        print(f"note: the input is {len(ids)} tokens with [CLS] and [SEP], longer than the T={trained} the model was "
              f"trained at: positions past {trained} were never trained", file=sys.stderr)
    return dict(kind=kind, ids=ids, where=where, was=was, name=name)


def show_input(p):
    masked = set(p["where"])
    shown = [("__" if i in masked else p["name"](t)) for i, t in enumerate(p["ids"])]
    if p["kind"] == "bytes":
        shown = ["__" if i in masked else (f"{t:02x}" if t < 256 else p["name"](t)) for i, t in enumerate(p["ids"])]
    print(f"input ({len(p['ids'])} tokens, {len(masked)} masked as __): {' '.join(shown)}")


def predict(export, ids, where, top):
    """The model's top predictions at the masked positions: [(ids, probabilities)] per position."""
    try:
        import torch
        from transformers import BertForMaskedLM
    except ImportError as e:
        raise FillMaskError(f"needs PyTorch and transformers ({e}): python3 -m pip install torch transformers") from None
    model = BertForMaskedLM.from_pretrained(export)
    model.eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=torch.zeros_like(x)).logits[0]
    probs = torch.softmax(logits[where].float(), dim=-1)
    p, i = probs.topk(min(top, probs.shape[-1]), dim=-1)
    return [(i[k].tolist(), p[k].tolist()) for k in range(len(where))]


def parse_positions(s):
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: expected 0-based positions separated by commas, like 0,5,9") from None


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", help="an export directory (./trainer's --out)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--text", help='text (or, for a bytes export, its UTF-8 bytes); "[MASK]" marks a position to fill')
    src.add_argument("--file", help="a file: bytes [--offset, --offset + --length)")
    ap.add_argument("--offset", type=int, default=0, help="first byte of --file (default 0)")
    ap.add_argument("--length", type=int, help="bytes of --file (default: what the model's positions hold)")
    ap.add_argument("--positions", type=parse_positions, help="mask these 0-based input positions: I,J,..")
    ap.add_argument("--mask-every", type=int, help="mask input positions 0, K, 2K, ...")
    ap.add_argument("--top", type=int, default=5, help="predictions shown per position (default 5)")
    ap.add_argument("--inputs-only", action="store_true", help="print the masked input and stop (no PyTorch needed)")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        p = prepare(args)
        show_input(p)
        if args.inputs_only:
            return 0
        preds = predict(args.export, p["ids"], p["where"], args.top)
    except FillMaskError as e:
        die(str(e))
    right = known = 0
    for pos, was, (ids, probs) in zip(p["where"], p["was"], preds):
        cands = " | ".join(f"{p['name'](i)} {q:.3f}" for i, q in zip(ids, probs))
        print(f"position {pos - 1:4d} (was {p['name'](was)}): {cands}")
        if was is not None:
            known += 1
            right += ids[0] == was
    if known:
        print(f"top-1 right at {right} of {known} masked positions ({100.0 * right / known:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
