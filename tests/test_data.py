import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from nmt.data import readers
from nmt.data.batching import collate, epoch_batches, make_batches, rank_batches, training_stream
from nmt.data.encode import drop_reason
from nmt.data.pipeline import prepare
from nmt.data.shards import EncodedSplit
from nmt.data.sources import read_blocks
from nmt.data.vocab import Vocab
from nmt.modeling.transformer import BOS, EOS, PAD
from tests.conftest import ROOT, local_config, multi30k_lines


def test_drop_reason():
    assert drop_reason(0, 5, 250, 1.5) == "empty"
    assert drop_reason(5, 0, 250, 1.5) == "empty"
    assert drop_reason(251, 250, 250, 1.5) == "too_long"
    assert drop_reason(10, 16, 250, 1.5) == "ratio"
    assert drop_reason(10, 15, 250, 1.5) is None
    assert drop_reason(250, 250, 250, 1.5) is None


def test_prepare_filters_train_keeps_valid_test_and_round_trips(corpus):
    cfg = local_config(corpus)
    out = prepare(cfg)
    manifest = json.loads((out / "manifest.json").read_text())
    vocab = Vocab(out / "spm.model")
    train = EncodedSplit(out, "train", len(vocab))
    stats = manifest["stats"]["train"]
    assert stats["dropped_empty"] == 2 and stats["dropped_too_long"] == 1 and stats["dropped_ratio"] >= 1
    assert stats["kept"] == len(train) == 1500 - sum(v for k, v in stats.items() if k.startswith("dropped"))
    # what was kept is exactly the lines the filter accepts, in order
    en = [line.strip() for line in readers.read_lines(corpus / "train.en")]
    de = [line.strip() for line in readers.read_lines(corpus / "train.de")]
    expected = [(s, t) for s, t in zip(vocab.encode(en), vocab.encode(de))
                if drop_reason(len(s), len(t), cfg.max_len, cfg.max_ratio) is None]
    assert len(expected) == len(train)
    for i in (0, 7, len(train) - 1):
        assert train[i][0].tolist() == expected[i][0] and train[i][1].tolist() == expected[i][1]
    # valid and test: every line, in order, CRLF and BOM removed
    for split, n in (("valid", 20), ("test", 15)):
        assert len(EncodedSplit(out, split, len(vocab))) == n
        raw = (out / f"{split}.en").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(raw) == n
    assert (out / "valid.en").read_text().split("\n")[3] == ""
    test_en = (out / "test.en").read_text(encoding="utf-8").split("\n")
    assert test_en[0] == multi30k_lines("test_2016_flickr", "en", 1)[0]
    assert not any("\r" in line or "\ufeff" in line for line in test_en)
    # round trip on real text: ids decode back to the (NFKC-normalized) sentence
    test = EncodedSplit(out, "test", len(vocab))
    for i, line in enumerate(multi30k_lines("test_2016_flickr", "de", 15)):
        assert vocab.decode(test[i][1].tolist()) == " ".join(unicodedata.normalize("NFKC", line).split())


def test_source_word_cap_drops_long_training_pairs_only(corpus):
    from nmt.data.pipeline import prepared_dir

    uncapped = local_config(corpus, prepared_dir=None)
    capped = local_config(corpus, prepared_dir=None, max_src_words=8)
    assert prepared_dir(capped) != prepared_dir(uncapped)  # never overwrites the uncapped data
    out = prepare(local_config(corpus, max_src_words=8))
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    vocab = Vocab(out / "spm.model")
    train = EncodedSplit(out, "train", len(vocab))
    assert stats["train"]["dropped_src_words"] > 100
    assert all(len(vocab.decode(train[i][0].tolist()).split()) <= 8 for i in range(len(train)))
    assert stats["test"]["kept"] == 15 and stats["valid"]["kept"] == 20  # evaluation keeps long sentences


def folder_bytes(directory) -> dict:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_workers_write_the_same_bytes_as_one_worker(corpus, monkeypatch):
    """Every file (shards, kept text, vocabulary, the manifest with its dropped-pair report) is the same bytes on 1
    worker and on 3, each split in chunks of 7 pairs, so that valid and test go through the pool too; SentencePiece
    learns from a sample of 1,000 of the 3,000 sentences, the same one each time."""
    from nmt.data import encode

    pools = []
    real_pool = encode.worker_pool
    monkeypatch.setattr(encode, "worker_pool", lambda *args: pools.append(args[0]) or real_pool(*args))
    settings = dict(chunk_lines=7, max_src_words=12, vocab_sample=1000)
    one = folder_bytes(prepare(local_config(corpus, workers=1, prepared_dir=str(corpus / "one"), **settings)))
    assert pools == []
    three = folder_bytes(prepare(local_config(corpus, workers=3, prepared_dir=str(corpus / "three"), **settings)))
    assert pools == [3, 3, 3, 3]  # the vocabulary text, then train, valid and test, each on a pool
    stats = json.loads(one["manifest.json"])["stats"]
    assert {"dropped_empty", "dropped_too_long", "dropped_ratio", "dropped_src_words"} <= set(stats["train"])
    assert one.keys() == three.keys() and all(one[name] == three[name] for name in one), \
        [name for name in one if one[name] != three.get(name)]


def test_vocab_special_ids_and_no_unk(corpus):
    out = prepare(local_config(corpus))
    vocab = Vocab(out / "spm.model")
    sp = vocab.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD, 1, BOS, EOS)
    ids = vocab.encode(["Ωμέγα 漢字 ☃"])[0]
    assert 1 not in ids  # byte fallback: never <unk>
    assert vocab.decode(ids) == "Ωμέγα 漢字 ☃"


def test_manifest_reuses_and_detects_changed_input(corpus):
    cfg = local_config(corpus)
    out = prepare(cfg)
    stamp = (out / "train.src.bin").stat().st_mtime_ns
    assert prepare(cfg) == out
    assert (out / "train.src.bin").stat().st_mtime_ns == stamp  # no-op
    lines = (corpus / "train.de").read_text().split("\n")
    lines[0] = "Etwas ganz anderes."
    (corpus / "train.de").write_text("\n".join(lines))
    prepare(cfg)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["key"]["inputs"]["train"][str(corpus / "train.de")] == readers.file_digest(corpus / "train.de")
    assert Vocab(out / "spm.model").decode(EncodedSplit(out, "train", 600)[0][1].tolist()) == "Etwas ganz anderes."
    prepare(local_config(corpus, max_len=50))  # a changed setting rebuilds too
    assert json.loads((out / "manifest.json").read_text())["key"]["filters"]["max_len"] == 50


def run_prepare(*overrides, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "nmt.prepare", *overrides], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_mismatched_files_are_refused_and_nothing_is_left(corpus):
    lines = (corpus / "train.de").read_text().split("\n")
    (corpus / "train.de").write_text("\n".join(lines[:-2]) + "\n")  # one line short
    result = run_prepare("data=local", f"data.train={corpus}/train", f"data.valid={corpus}/valid",
                         f"data.test={corpus}/test", "data.vocab_size=600", f"data.prepared_dir={corpus}/prepared")
    assert result.returncode == 2
    assert f"{corpus}/train.en has 1500 lines" in result.stderr + result.stdout
    assert f"{corpus}/train.de has 1499 lines" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert not (corpus / "prepared").exists()
    assert not [p for p in corpus.iterdir() if p.name.startswith(".prepared")]


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "bad.en").write_bytes(b"fine\nalso fine\nbroken \xff byte\n")
    with pytest.raises(readers.DataError, match=r"bad\.en:3: invalid UTF-8"):
        list(readers.read_lines(tmp_path / "bad.en"))


AWKWARD_LINES = [b"\xef\xbb\xbfbom first\r\n", b"\n", b"crlf\r\n", b"two cr\r\r\n", b"lone \r inside\n",
                 "next line \x85 and line separator \u2028 are not ends\n".encode(), b"   spaces kept  \n",
                 "\ufeffa BOM past line 1 is text\n".encode(), b"no final newline"]


@pytest.mark.parametrize("size", [1, 2, 4, 100])
def test_lines_decoded_a_block_at_a_time_are_the_lines_decoded_one_by_one(tmp_path, size):
    """The block decoder against the rule it replaces, applied line by line: strict UTF-8, LF or CRLF cut, a BOM cut
    on line 1 only, nothing else touched."""
    one_by_one = [raw.decode("utf-8").removeprefix("\ufeff" if number == 1 else "").rstrip("\r\n")
                  for number, raw in enumerate(AWKWARD_LINES, 1)]
    (tmp_path / "a.en").write_bytes(b"".join(AWKWARD_LINES))
    (tmp_path / "a.de").write_bytes(b"".join(AWKWARD_LINES))
    with open(tmp_path / "a.en", "rb") as f:
        blocks = list(readers.raw_blocks(f, size))
    starts = [1 + sum(map(len, blocks[:i])) for i in range(len(blocks))]
    assert [line for first, raw in zip(starts, blocks) for line in readers.decode_lines(tmp_path / "a.en", raw, first)
            ] == one_by_one == list(readers.read_lines(tmp_path / "a.en"))
    pairs = [pair for block in readers.line_blocks(tmp_path / "a.en", tmp_path / "a.de", size) for pair in block.pairs()]
    assert pairs == list(zip(one_by_one, one_by_one))


@pytest.mark.parametrize("src_bad, tgt_bad, reported", [(5, 3, "a.de:3"), (3, 5, "a.en:3"), (3, 3, "a.en:3")])
def test_of_two_bad_lines_in_a_block_the_first_a_pair_reader_meets_is_reported(tmp_path, src_bad, tgt_bad, reported):
    for name, bad in (("a.en", src_bad), ("a.de", tgt_bad)):
        lines = [b"fine\n"] * 6
        lines[bad - 1] = b"bro\xffken\n"
        (tmp_path / name).write_bytes(b"".join(lines))
    block, = readers.line_blocks(tmp_path / "a.en", tmp_path / "a.de", 10)
    with pytest.raises(readers.DataError, match=rf"/{reported}: invalid UTF-8 at byte 3 \(invalid start byte\)"):
        block.pairs()


def test_missing_file_names_its_path(tmp_path):
    with pytest.raises(readers.DataError, match=r"missing file: .*/train\.en \(or .*/train\.en\.gz\)"):
        list(read_blocks(local_config(tmp_path), "train", 10))


def test_hub_rows_with_the_wmt14_schema():
    datasets = pytest.importorskip("datasets")
    rows = [{"translation": {"de": "Hallo Welt.", "en": "Hello world."}},
            {"translation": {"de": "Zweite Zeile\r\n", "en": "Second line"}}]
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
    assert list(readers.pairs_from_hub_split(dd["test"], "en", "de")) == [
        ("Hello world.", "Hallo Welt."), ("Second line", "Zweite Zeile")]
    with pytest.raises(readers.DataError, match="expected en and fr"):
        list(readers.pairs_from_hub_split(dd["test"], "en", "fr"))


@pytest.mark.slow  # tens of seconds: make test stays under 10 minutes
def test_offline_hub_fails_fast_with_instructions(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(readers, "_hub_reachable", lambda: False)
    with pytest.raises(readers.DataError, match="data=local"):
        readers.load_hub_split("wmt/wmt14-not-cached", "de-en", "test")


def random_lengths(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n), rng.integers(1, 60, n)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_batches_respect_budget_and_cover_every_pair_once(world_size):
    src, tgt = random_lengths(1000)
    batches = make_batches(src, tgt, 300, seed=1, epoch=0, world_size=world_size)
    per_rank = [rank_batches(batches, r, world_size) for r in range(world_size)]
    assert len({len(b) for b in per_rank}) == 1
    seen = np.concatenate([b for rank in per_rank for b in rank])
    assert sorted(seen.tolist()) == list(range(1000))
    for b in batches:
        assert len(b) * max(src[b].max(), tgt[b].max()) <= 300


def test_batches_are_deterministic_and_change_with_epoch():
    src, tgt = random_lengths(500)
    a = make_batches(src, tgt, 256, seed=3, epoch=2)
    b = make_batches(src, tgt, 256, seed=3, epoch=2)
    c = make_batches(src, tgt, 256, seed=3, epoch=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_length_bucketing_keeps_padding_low():
    src, tgt = random_lengths(5000)
    batches = make_batches(src, tgt, 4096, seed=0, epoch=0)
    real = sum(int(src[b].sum() + tgt[b].sum()) for b in batches)
    padded = sum(2 * len(b) * int(max(src[b].max(), tgt[b].max())) for b in batches)
    assert real / padded > 0.6  # random independent src/tgt lengths; real corpora do much better


def test_too_long_pair_for_budget_is_an_error():
    with pytest.raises(ValueError, match="exceeds train.max_tokens=50"):
        make_batches(np.array([10, 60]), np.array([10, 5]), 50, seed=0, epoch=0)


def test_resume_at_position_gives_the_same_batches(corpus):
    out = prepare(local_config(corpus))
    shard = EncodedSplit(out, "train", 600)
    full = list(epoch_batches(shard, 512, seed=5, epoch=1, rank=1, world_size=2))
    resumed = list(epoch_batches(shard, 512, seed=5, epoch=1, rank=1, world_size=2, start=4))
    assert [p for p, _ in resumed] == [p for p, _ in full][4:]
    for (_, a), (_, b) in zip(full[4:], resumed):
        assert a.src.equal(b.src) and a.tgt_in.equal(b.tgt_in)


def stream_updates(shard, world_size: int, update_freq: int, epoch: int, start: int, updates: int):
    """The target rows each update trains on, over every rank, and every rank's data position after it."""
    streams = [training_stream(shard, 2048, 5, rank, world_size, epoch, start) for rank in range(world_size)]
    rows, positions = [], []
    for _ in range(updates):
        items = [[next(stream) for _ in range(update_freq)] for stream in streams]
        rows.append(sorted(tuple(row) for rank in items for _, _, b in rank for row in b.tgt_out.tolist()))
        positions.append({rank[-1][:2] for rank in items})
    return rows, positions


def test_an_update_trains_the_same_batches_on_any_world_size(corpus):
    """One global sequence dealt out to the ranks: 1 x 4, 2 x 2 and 4 x 1 micro-batches are the same set per
    update, every rank agrees on the data position, and resuming from it on another world size continues the same
    sequence (across an epoch's end too)."""
    shard = EncodedSplit(prepare(local_config(corpus)), "train", 600)
    one, one_positions = stream_updates(shard, 1, 4, 0, 0, 12)
    for world_size in (2, 4):
        rows, positions = stream_updates(shard, world_size, 4 // world_size, 0, 0, 12)
        assert rows == one and positions == one_positions
        assert all(len(p) == 1 for p in positions)
    (epoch, start), = one_positions[5]
    resumed, _ = stream_updates(shard, 2, 2, epoch, start, 6)
    assert resumed == one[6:]
    assert len({e for p in one_positions for e, _ in p}) > 1  # the 12 updates cross epochs


def test_collate_adds_bos_eos_and_pads_right(corpus):
    out = prepare(local_config(corpus))
    shard = EncodedSplit(out, "train", 600)
    batch = collate(shard, np.array([0, 1]))
    for row, i in enumerate((0, 1)):
        src, tgt = shard[i]
        assert batch.src[row, : len(src) + 1].tolist() == src.tolist() + [EOS]
        assert batch.tgt_in[row, : len(tgt) + 1].tolist() == [BOS] + tgt.tolist()
        assert batch.tgt_out[row, : len(tgt) + 1].tolist() == tgt.tolist() + [EOS]
        assert batch.src[row, len(src) + 1 :].eq(PAD).all()


def test_decoded_newline_byte_cannot_break_line_alignment(corpus):
    vocab = Vocab(prepare(local_config(corpus)) / "spm.model")
    newline = vocab.sp.piece_to_id("<0x0A>")
    hello = vocab.encode(["Hallo"])[0]
    assert "\n" in vocab.sp.decode(hello + [newline] + hello)  # what SentencePiece alone would emit
    decoded = vocab.decode(hello + [newline] + hello)
    assert "\n" not in decoded and "\r" not in decoded and decoded.split() == ["Hallo", "Hallo"]


def test_prefetcher_yields_in_order_and_raises_where_the_iterator_did():
    from nmt.data.batching import Prefetcher

    assert list(Prefetcher(iter(range(50)), depth=3)) == list(range(50))

    def broken():
        yield 1
        yield 2
        raise ValueError("bad line 7")

    stream = Prefetcher(broken(), depth=1)
    assert next(stream) == 1 and next(stream) == 2
    with pytest.raises(ValueError, match="bad line 7"):
        next(stream)
    endless = Prefetcher(iter(lambda: 0, 1), depth=2)  # never ends: close() must stop its thread
    assert next(endless) == 0
    endless.close()
    assert not endless._thread.is_alive()


def test_vectorized_collation_equals_a_per_sentence_loop(corpus):
    out = prepare(local_config(corpus))
    shard = EncodedSplit(out, "train", len(Vocab(out / "spm.model")))
    indices = np.array([5, 0, 17, 3, 400, 2])
    batch = collate(shard, indices)
    pairs = [shard[int(i)] for i in indices]
    width_src, width_tgt = max(len(s) for s, _ in pairs) + 1, max(len(t) for _, t in pairs) + 1
    for row, (s, t) in enumerate(pairs):
        assert batch.src[row].tolist() == [*s.tolist(), EOS] + [PAD] * (width_src - len(s) - 1)
        assert batch.tgt_in[row].tolist() == [BOS, *t.tolist()] + [PAD] * (width_tgt - len(t) - 1)
        assert batch.tgt_out[row].tolist() == [*t.tolist(), EOS] + [PAD] * (width_tgt - len(t) - 1)
    assert batch.target_tokens == sum(len(t) + 1 for _, t in pairs) == int(batch.tgt_out.ne(PAD).sum())
